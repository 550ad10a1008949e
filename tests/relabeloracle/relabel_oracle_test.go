package relabeloracle

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"go.yaml.in/yaml/v2"
)

// testdata is tests/testdata/identity/, the Python suites' vectors.
var testdata = filepath.Join("..", "testdata", "identity")

// relabelCase is one entry of relabel_cases.yaml.
type relabelCase struct {
	ID       string            `yaml:"id"`
	Input    map[string]string `yaml:"input"`
	Rules    []*relabel.Config `yaml:"rules"`
	Expected map[string]string `yaml:"expected"`
	Dropped  bool              `yaml:"dropped"`
}

// errorCase is one entry of relabel_errors.yaml: rules Prometheus must refuse too.
type errorCase struct {
	ID    string `yaml:"id"`
	Rules any    `yaml:"rules"`
	Error string `yaml:"error"`
}

// readCases decodes the list of test vectors in testdata/name; an empty list fails the test.
func readCases[T any](t *testing.T, name string) []T {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testdata, name))
	if err != nil {
		t.Fatal(err)
	}
	var cases []T
	if err := yaml.UnmarshalStrict(data, &cases); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(cases) == 0 {
		t.Fatalf("%s: no cases", name)
	}
	return cases
}

// TestCasesAgreeWithPrometheus applies each case's rules with relabel.ProcessBuilder, under
// Prometheus 3's default UTF-8 label-name validation, and compares with the expectation the
// Python tests hold (tests/identity/test_relabel.py).
func TestCasesAgreeWithPrometheus(t *testing.T) {
	for _, c := range readCases[relabelCase](t, "relabel_cases.yaml") {
		t.Run(c.ID, func(t *testing.T) {
			if !c.Dropped && c.Expected == nil {
				t.Fatal("case has neither expected nor dropped: true")
			}
			for i, rule := range c.Rules {
				if err := rule.Validate(model.UTF8Validation); err != nil {
					t.Fatalf("rules[%d]: Prometheus refuses the rule: %v", i, err)
				}
			}
			builder := labels.NewBuilder(labels.FromMap(c.Input))
			keep := relabel.ProcessBuilder(builder, c.Rules...)
			if c.Dropped {
				if keep {
					t.Fatalf("the vector says dropped; Prometheus keeps %v", builder.Labels().Map())
				}
				return
			}
			if !keep {
				t.Fatalf("the vector expects %v; Prometheus drops the labels", c.Expected)
			}
			if got := builder.Labels().Map(); !reflect.DeepEqual(got, c.Expected) {
				t.Fatalf("the vector expects\n  %v\nPrometheus gives\n  %v", c.Expected, got)
			}
		})
	}
}

// TestErrorsArePrometheusErrors checks that every rule list the Python loader refuses is refused
// by Prometheus too (at YAML decoding or by Config.Validate); the messages differ by design (ours
// name the rule index and field).
func TestErrorsArePrometheusErrors(t *testing.T) {
	for _, c := range readCases[errorCase](t, "relabel_errors.yaml") {
		t.Run(c.ID, func(t *testing.T) {
			text, err := yaml.Marshal(c.Rules)
			if err != nil {
				t.Fatal(err)
			}
			var rules []*relabel.Config
			if err := yaml.UnmarshalStrict(text, &rules); err != nil {
				return // refused while decoding
			}
			for _, rule := range rules {
				if err := rule.Validate(model.UTF8Validation); err != nil {
					return // refused by validation
				}
			}
			t.Fatalf("Python refuses these rules (%s); Prometheus accepts them:\n%s", c.Error, text)
		})
	}
}
