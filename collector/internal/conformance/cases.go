// Package conformance runs the gpumetrics.v1 conformance cases of tests/testdata/conformance
// (README.md there describes the step language) against a sidecar reached over gRPC. Two
// runners use it: the Go fake sidecar's (receiver/gpumetricsreceiver/internal/fakesidecar,
// conformance_test.go), whose stores the cases control, and the real sidecar's (real_test.go
// here: one `gpumetrics serve --simulate` process per case), which runs the cases without a
// controlled step. The Python runner (tests/conformance) runs the same files against the
// sidecar's own server and stores.
package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Files are the case files, by service.
var Files = map[string]string{"pull": "pull.yaml", "logs": "logs_pull.yaml", "profiler": "profiler.yaml"}

// FirstCollectionPoints is the size of the batch a controlling runner stores for
// `given: first_collection`.
const FirstCollectionPoints = 3

// controlled are the steps only a runner that controls the stores can run.
var controlled = []string{"append", "advance", "held"}

var stepsOf = map[string][]string{
	"pull":     {"append", "advance", "held", "restart", "pull"},
	"logs":     {"append", "advance", "held", "restart", "pull"},
	"profiler": {"restart", "declare", "exits", "open", "send", "close"},
}

// Dir is the directory of the case files (tests/testdata/conformance of this repository).
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("conformance: no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "tests", "testdata", "conformance")
}

// Case is one case of a file.
type Case struct {
	Name   string         `yaml:"name"`
	Rule   string         `yaml:"rule"`
	Config map[string]any `yaml:"config"`
	Given  string         `yaml:"given"`
	Steps  []Step         `yaml:"steps"`

	// File and Service are those of the file the case is in.
	File    string `yaml:"-"`
	Service string `yaml:"-"`
}

// ID names the case as the Python runner does: "file::name".
func (c Case) ID() string { return c.File + "::" + c.Name }

// Controlled reports whether the case needs a runner that controls the stores.
func (c Case) Controlled() bool {
	for _, s := range c.Steps {
		if slices.Contains(controlled, s.Kind) {
			return true
		}
	}
	return false
}

// Step is one step: its kind, its body and its `want`, decoded by the runner for the kind.
type Step struct {
	Kind string
	Body yaml.Node
	Want *yaml.Node
}

// UnmarshalYAML reads a step mapping: one step key, and `want`.
func (s *Step) UnmarshalYAML(node *yaml.Node) error {
	if node.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a step is a mapping", node.Line)
	}
	for i := 0; i+1 < len(node.Content); i += 2 {
		key, value := node.Content[i].Value, node.Content[i+1]
		switch {
		case key == "want":
			s.Want = value
		case s.Kind != "":
			return fmt.Errorf("line %d: two step keys, %q and %q", node.Line, s.Kind, key)
		default:
			s.Kind, s.Body = key, *value
		}
	}
	if s.Kind == "" {
		return fmt.Errorf("line %d: no step key", node.Line)
	}
	return nil
}

type file struct {
	Format  int    `yaml:"format"`
	Service string `yaml:"service"`
	Cases   []Case `yaml:"cases"`
}

// Load reads the case file of service (see Files).
func Load(service string) ([]Case, error) {
	name, ok := Files[service]
	if !ok {
		return nil, fmt.Errorf("conformance: no service %q", service)
	}
	raw, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		return nil, err
	}
	var f file
	if err := strict(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if f.Format != 1 || f.Service != service {
		return nil, fmt.Errorf("%s: want format 1 and service %q, got %d and %q", name, service, f.Format, f.Service)
	}
	seen := map[string]bool{}
	for i := range f.Cases {
		c := &f.Cases[i]
		c.File, c.Service = name, service
		if c.Name == "" || seen[c.Name] {
			return nil, fmt.Errorf("%s: cases[%d]: a unique non-empty name is needed, got %q", name, i, c.Name)
		}
		seen[c.Name] = true
		for j, s := range c.Steps {
			if !slices.Contains(stepsOf[service], s.Kind) {
				return nil, fmt.Errorf("%s: steps[%d]: %q is not a step of %s (%v)", c.ID(), j, s.Kind, service, stepsOf[service])
			}
		}
		if c.Given != "" && (c.Given != "first_collection" || service == "profiler") {
			return nil, fmt.Errorf("%s: given: only first_collection, in pull and logs files", c.ID())
		}
	}
	return f.Cases, nil
}

// strict decodes YAML into v, refusing keys v has no field for.
func strict(raw []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// decodeNode decodes node into v strictly (unknown keys are errors).
func decodeNode(node *yaml.Node, v any) error {
	if node == nil {
		return strict([]byte("{}"), v)
	}
	raw, err := yaml.Marshal(node)
	if err != nil {
		return err
	}
	return strict(raw, v)
}
