package conformance

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestCanonicalBatchesArePinned: the Go builders write the bytes batches.yaml pins, the bytes
// the Python runner's builders write too (tests/conformance checks the same file).
func TestCanonicalBatchesArePinned(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(Dir(), "batches.yaml"))
	require.NoError(t, err)
	var f struct {
		Format  int `yaml:"format"`
		Batches []struct {
			Signal   string `yaml:"signal"`
			Sequence uint64 `yaml:"sequence"`
			Items    uint64 `yaml:"items"`
			Hex      string `yaml:"hex"`
		} `yaml:"batches"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &f))
	require.Len(t, f.Batches, 2)
	for _, b := range f.Batches {
		service := map[string]string{"metrics": "pull", "logs": "logs"}[b.Signal]
		require.NotEmpty(t, service, b.Signal)
		assert.Equal(t, strings.ReplaceAll(b.Hex, " ", ""), hex.EncodeToString(Batch(service, b.Sequence, b.Items)), b.Signal)
	}
}

// TestEveryFileLoads: the case files follow the step language as this package reads it.
func TestEveryFileLoads(t *testing.T) {
	for service := range Files {
		cases, err := Load(service)
		require.NoError(t, err, service)
		assert.NotEmpty(t, cases, service)
		for _, c := range cases {
			for _, s := range c.Steps {
				assert.NotEmpty(t, s.Kind, c.ID())
			}
		}
	}
}
