package gpumetricsexporter

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap/confmaptest"
	"go.opentelemetry.io/collector/exporter/exportertest"
	"go.opentelemetry.io/collector/pipeline"

	"github.com/gpumetrics/gpumetrics/collector/exporter/gpumetricsexporter/internal/metadata"
)

func TestFactory(t *testing.T) {
	f := NewFactory()
	assert.Equal(t, "gpumetrics", f.Type().String())
	assert.Equal(t, metadata.ProfilesStability, f.ProfilesStability())

	cfg := f.CreateDefaultConfig().(*Config)
	cfg.Endpoint = "unix:///nonexistent/profiler.sock"
	exp, err := f.CreateProfiles(context.Background(), exportertest.NewNopSettings(metadata.Type), cfg)
	require.NoError(t, err)
	assert.False(t, exp.Capabilities().MutatesData)

	_, err = f.CreateProfiles(context.Background(), exportertest.NewNopSettings(metadata.Type), struct{}{})
	require.ErrorIs(t, err, errConfigType)
	_, err = f.CreateMetrics(context.Background(), exportertest.NewNopSettings(metadata.Type), cfg)
	require.ErrorIs(t, err, pipeline.ErrSignalNotSupported, "a profiles exporter only")
}

// TestComponentLifecycle follows mdatagen's generated lifecycle test, with `tests.config` from
// metadata.yaml: Shutdown without Start, then two fresh instances started and stopped. The
// endpoint does not exist: the exporter starts anyway (it waits for the sidecar) and stops at
// once.
func TestComponentLifecycle(t *testing.T) {
	f := NewFactory()
	cm, err := confmaptest.LoadConf("metadata.yaml")
	require.NoError(t, err)
	sub, err := cm.Sub("tests::config")
	require.NoError(t, err)
	cfg := f.CreateDefaultConfig()
	require.NoError(t, sub.Unmarshal(&cfg))
	require.NoError(t, cfg.(*Config).Validate())

	t.Run("shutdown without start", func(t *testing.T) {
		exp, err := f.CreateProfiles(context.Background(), exportertest.NewNopSettings(metadata.Type), cfg)
		require.NoError(t, err)
		require.NoError(t, exp.Shutdown(context.Background()))
	})
	t.Run("start and shutdown twice", func(t *testing.T) {
		for range 2 {
			exp, err := f.CreateProfiles(context.Background(), exportertest.NewNopSettings(metadata.Type), cfg)
			require.NoError(t, err)
			require.NoError(t, exp.Start(context.Background(), componenttest.NewNopHost()))
			require.NoError(t, exp.ConsumeProfiles(context.Background(), profiles(profilerProcess{pid: 1, exe: "/sbin/init"})))
			require.NoError(t, exp.Shutdown(context.Background()))
		}
	})
}

func TestStartFailsOnAMissingTokenFile(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	cfg.Endpoint = "unix:///nonexistent/profiler.sock"
	cfg.TokenFile = "/nonexistent/token"
	exp, err := newProfilesExporter(newTestEnv(t).set, cfg)
	require.NoError(t, err)
	err = exp.start(context.Background(), componenttest.NewNopHost())
	require.ErrorContains(t, err, "'token_file': open /nonexistent/token: no such file or directory")
	require.NoError(t, exp.shutdown(context.Background()))
}
