package gpumetricsreceiver

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/gpumetrics/gpumetrics/collector/internal/mdatadoc"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
)

// TestMetadataMatchesYAML keeps the hand-written internal/metadata in step with metadata.yaml.
func TestMetadataMatchesYAML(t *testing.T) {
	cm, err := confmaptest.LoadConf("metadata.yaml")
	require.NoError(t, err)
	assert.Equal(t, metadata.Type.String(), cm.Get("type"))
	assert.Equal(t, []any{"metrics", "logs"}, cm.Get("status::stability::development"))

	env := newTestEnv(t)
	tb, err := metadata.NewTelemetryBuilder(env.set.TelemetrySettings)
	require.NoError(t, err)
	tb.GpumetricsSidecarDroppedDataPoints.Add(context.Background(), 1)
	tb.GpumetricsSidecarRestarts.Add(context.Background(), 1)
	tb.GpumetricsSidecarDroppedLogRecords.Add(context.Background(), 1)

	telemetry, ok := cm.Get("telemetry::metrics").(map[string]any)
	require.True(t, ok)
	require.Len(t, telemetry, 3)
	for name, raw := range telemetry {
		spec := raw.(map[string]any)
		m, err := env.telemetry.GetMetric("otelcol_" + name)
		require.NoError(t, err, "metadata.yaml lists %s", name)
		assert.Equal(t, spec["unit"], m.Unit, name)
		assert.Equal(t, spec["description"], m.Description, name)
	}
}

// TestDocumentation: documentation.md is what mdatagen would generate from metadata.yaml
// (collector/internal/mdatadoc renders it in mdatagen's layout).
func TestDocumentation(t *testing.T) { mdatadoc.Check(t) }
