package gpumetricsexporter

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/gpumetrics/gpumetrics/collector/exporter/gpumetricsexporter/internal/metadata"
	"github.com/gpumetrics/gpumetrics/collector/internal/mdatadoc"
)

// TestMetadataMatchesYAML keeps the hand-written internal/metadata in step with metadata.yaml:
// every instrument it lists is collected from a started exporter under its otelcol_ name with
// the same unit and description.
func TestMetadataMatchesYAML(t *testing.T) {
	cm, err := confmaptest.LoadConf("metadata.yaml")
	require.NoError(t, err)
	assert.Equal(t, metadata.Type.String(), cm.Get("type"))
	assert.Equal(t, []any{"profiles"}, cm.Get("status::stability::development"))

	r := newRig(t, true, nil)
	telemetry, ok := cm.Get("telemetry::metrics").(map[string]any)
	require.True(t, ok)
	require.Len(t, telemetry, 8)
	for name, raw := range telemetry {
		spec := raw.(map[string]any)
		m, err := r.env.telemetry.GetMetric("otelcol_" + name)
		require.NoError(t, err, "metadata.yaml lists %s", name)
		assert.Equal(t, spec["unit"], m.Unit, name)
		assert.Equal(t, spec["description"], m.Description, name)
	}
}

// TestDocumentation: documentation.md is what mdatagen would generate from metadata.yaml
// (collector/internal/mdatadoc renders it in mdatagen's layout).
func TestDocumentation(t *testing.T) { mdatadoc.Check(t) }
