package manifests

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-telemetry/opentelemetry-collector-contrib/processor/k8sattributesprocessor"
	"go.opentelemetry.io/collector/confmap"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The gateway's k8sattributes settings, as rendered, are accepted by the processor's own
// configuration (the version otelcol-contrib 0.161.0 ships), and associate by container.id only.
func TestGatewayK8sattributesConfigIsValid(t *testing.T) {
	found := 0
	for path, objs := range decodeAll(t) {
		for _, obj := range objs {
			cm, ok := obj.(*corev1.ConfigMap)
			if !ok || !strings.HasSuffix(cm.Name, "-gateway") {
				continue
			}
			found++
			var config map[string]any
			if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &config); err != nil {
				t.Fatalf("%s: %v", filepath.Base(path), err)
			}
			processors, _ := config["processors"].(map[string]any)
			raw, ok := processors["k8sattributes"].(map[string]any)
			if !ok {
				t.Fatalf("%s: no processors::k8sattributes", filepath.Base(path))
			}
			cfg := k8sattributesprocessor.NewFactory().CreateDefaultConfig()
			if err := confmap.NewFromStringMap(raw).Unmarshal(cfg); err != nil {
				t.Fatalf("%s: k8sattributes: %v", filepath.Base(path), err)
			}
			if err := confmap.Validate(cfg); err != nil {
				t.Fatalf("%s: k8sattributes: %v", filepath.Base(path), err)
			}
			assoc, _ := raw["pod_association"].([]any)
			if len(assoc) != 1 {
				t.Fatalf("%s: pod_association %v: want exactly the container.id rule", filepath.Base(path), assoc)
			}
			sources := assoc[0].(map[string]any)["sources"].([]any)
			if len(sources) != 1 || sources[0].(map[string]any)["from"] != "resource_attribute" ||
				sources[0].(map[string]any)["name"] != "container.id" {
				t.Errorf("%s: pod_association sources %v: want only resource_attribute container.id", filepath.Base(path), sources)
			}
		}
	}
	if found == 0 {
		t.Fatal("no gateway ConfigMap rendered (deploy/manifests/gpumetrics-gateway.yaml)")
	}
}
