// Package mdatadoc writes a component's documentation page
// (receiver/gpumetricsreceiver/documentation.md, exporter/gpumetricsexporter/documentation.md)
// from its metadata.yaml in the layout the Collector's mdatagen generates
// (https://github.com/open-telemetry/opentelemetry-collector/tree/main/cmd/mdatagen): mdatagen is
// not served by the Go module proxy this project reaches, so the components keep hand-written
// metadata, and their tests check the page against this rendering (Check), as mdatagen's
// generated files would be checked for freshness.
package mdatadoc

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Header replaces mdatagen's "Code generated" comment: the file is derived, not hand-edited.
const Header = "[comment]: <> (Rendered from metadata.yaml in mdatagen's layout by collector/internal/mdatadoc; edit metadata.yaml, then run this package's test with GPUMETRICS_UPDATE_DOCUMENTATION=1.)"

type attribute struct {
	Description string   `yaml:"description"`
	Type        string   `yaml:"type"`
	Enum        []string `yaml:"enum"`
}

type instrument struct {
	ValueType string `yaml:"value_type"`
	Monotonic bool   `yaml:"monotonic"`
}

type metric struct {
	Enabled     bool        `yaml:"enabled"`
	Stability   string      `yaml:"stability"`
	Description string      `yaml:"description"`
	Unit        string      `yaml:"unit"`
	Sum         *instrument `yaml:"sum"`
	Gauge       *instrument `yaml:"gauge"`
	Attributes  []string    `yaml:"attributes"`
}

type metadata struct {
	Type       string               `yaml:"type"`
	Attributes map[string]attribute `yaml:"attributes"`
	Telemetry  struct {
		Metrics map[string]metric `yaml:"metrics"`
	} `yaml:"telemetry"`
}

// Render returns the documentation page for the metadata.yaml content raw.
func Render(raw []byte) (string, error) {
	var md metadata
	if err := yaml.Unmarshal(raw, &md); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n# %s\n", Header, md.Type)
	if len(md.Telemetry.Metrics) == 0 {
		return b.String(), nil
	}
	b.WriteString("\n## Internal Telemetry\n\nThe following telemetry is emitted by this component.\n")
	names := make([]string, 0, len(md.Telemetry.Metrics))
	for name := range md.Telemetry.Metrics {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		m := md.Telemetry.Metrics[name]
		if m.Stability == "" {
			return "", fmt.Errorf("telemetry metric %s: no stability", name)
		}
		stability := strings.ToUpper(m.Stability[:1]) + m.Stability[1:]
		fmt.Fprintf(&b, "\n### otelcol_%s\n\n%s\n\n", name, strings.TrimSpace(m.Description))
		switch {
		case m.Sum != nil:
			b.WriteString("| Unit | Metric Type | Value Type | Monotonic | Stability |\n| ---- | ----------- | ---------- | --------- | --------- |\n")
			fmt.Fprintf(&b, "| %s | Sum | %s | %t | %s |\n", m.Unit, title(m.Sum.ValueType), m.Sum.Monotonic, stability)
		case m.Gauge != nil:
			b.WriteString("| Unit | Metric Type | Value Type | Stability |\n| ---- | ----------- | ---------- | --------- |\n")
			fmt.Fprintf(&b, "| %s | Gauge | %s | %s |\n", m.Unit, title(m.Gauge.ValueType), stability)
		default:
			return "", fmt.Errorf("telemetry metric %s: neither sum nor gauge", name)
		}
		if len(m.Attributes) == 0 {
			continue
		}
		b.WriteString("\n#### Attributes\n\n| Name | Description | Values | Semantic Convention |\n| ---- | ----------- | ------ | ------------------- |\n")
		for _, a := range m.Attributes {
			attr, ok := md.Attributes[a]
			if !ok {
				return "", fmt.Errorf("telemetry metric %s: attribute %s is not defined", name, a)
			}
			values := "Any " + title(attr.Type)
			if len(attr.Enum) > 0 {
				values = title(attr.Type) + ": ``" + strings.Join(attr.Enum, "``, ``") + "``"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | - |\n", a, strings.TrimSpace(attr.Description), values)
		}
	}
	return b.String(), nil
}

// title is mdatagen's spelling of a value type: "int" -> "Int", "string" -> "Str".
func title(t string) string {
	switch t {
	case "string":
		return "Str"
	case "":
		return ""
	}
	return strings.ToUpper(t[:1]) + t[1:]
}

// Check fails t when the documentation page in the test's directory is not the rendering of
// its metadata.yaml. With GPUMETRICS_UPDATE_DOCUMENTATION=1 it writes the file instead, and
// still fails, so that an update cannot stay switched on unseen.
func Check(t *testing.T) {
	t.Helper()
	raw, err := os.ReadFile("metadata.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(raw)
	if err != nil {
		t.Fatalf("metadata.yaml: %v", err)
	}
	if os.Getenv("GPUMETRICS_UPDATE_DOCUMENTATION") == "1" {
		if err := os.WriteFile("documentation.md", []byte(want), 0o644); err != nil { //nolint:gosec // a documentation file
			t.Fatal(err)
		}
		t.Fatal("documentation.md rewritten from metadata.yaml; run again without GPUMETRICS_UPDATE_DOCUMENTATION")
	}
	got, err := os.ReadFile("documentation.md")
	if err != nil {
		t.Fatalf("documentation.md: %v (render it: GPUMETRICS_UPDATE_DOCUMENTATION=1 go test -run TestDocumentation .)", err)
	}
	if string(got) != want {
		t.Fatalf("documentation.md is not metadata.yaml's rendering (GPUMETRICS_UPDATE_DOCUMENTATION=1 go test -run TestDocumentation . rewrites it); want:\n%s", want)
	}
}
