package gpumetricsreceiver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap/confmaptest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/scraper/scraperhelper"

	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
)

func TestFactory(t *testing.T) {
	f := NewFactory()
	assert.Equal(t, "gpumetrics", f.Type().String())
	assert.Equal(t, metadata.MetricsStability, f.MetricsStability())

	cfg := f.CreateDefaultConfig().(*Config)
	cfg.Endpoint = "127.0.0.1:1"
	rcv, err := f.CreateMetrics(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	require.NoError(t, err)
	assert.NotNil(t, rcv)

	_, err = f.CreateMetrics(context.Background(), receivertest.NewNopSettings(metadata.Type), struct{}{}, consumertest.NewNop())
	require.ErrorIs(t, err, errConfigType)
}

// TestComponentLifecycle is mdatagen's generated lifecycle test (generated_component_test.go),
// with `tests.config` from metadata.yaml, for each signal: Shutdown without Start, then two fresh
// instances started and stopped.
func TestComponentLifecycle(t *testing.T) {
	f := NewFactory()
	tests := []struct {
		name     string
		createFn func(ctx context.Context, set receiver.Settings, cfg component.Config) (component.Component, error)
	}{
		{name: "logs", createFn: func(ctx context.Context, set receiver.Settings, cfg component.Config) (component.Component, error) {
			return f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
		}},
		{name: "metrics", createFn: func(ctx context.Context, set receiver.Settings, cfg component.Config) (component.Component, error) {
			return f.CreateMetrics(ctx, set, cfg, consumertest.NewNop())
		}},
	}
	cm, err := confmaptest.LoadConf("metadata.yaml")
	require.NoError(t, err)
	sub, err := cm.Sub("tests::config")
	require.NoError(t, err)
	cfg := f.CreateDefaultConfig()
	require.NoError(t, sub.Unmarshal(&cfg))
	require.NoError(t, cfg.(*Config).Validate())
	for _, tt := range tests {
		t.Run(tt.name+"-shutdown", func(t *testing.T) {
			c, err := tt.createFn(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg)
			require.NoError(t, err)
			require.NoError(t, c.Shutdown(context.Background()))
		})
		t.Run(tt.name+"-lifecycle", func(t *testing.T) {
			for range 2 {
				c, err := tt.createFn(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg)
				require.NoError(t, err)
				require.NoError(t, c.Start(context.Background(), componenttest.NewNopHost()))
				require.NoError(t, c.Shutdown(context.Background()))
			}
		})
	}
}

func TestSubprocessLifecycleShutdownWithoutStart(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	cfg.Command = "gpumetrics"
	rcv, err := NewFactory().CreateMetrics(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, rcv.Shutdown(context.Background()))
}

// TestShutdownEndsAnInFlightScrape holds a Pull in the fake sidecar until its context ends: with a
// one-hour scrape timeout, only the receiver's Shutdown can end it.
func TestShutdownEndsAnInFlightScrape(t *testing.T) {
	entered := make(chan struct{}, 1)
	fake := fakesidecar.New(fakesidecar.Options{OnPull: func(ctx context.Context) {
		entered <- struct{}{}
		<-ctx.Done()
	}})
	cfg := remoteConfig(serveTCP(t, fake))
	cfg.Timeout = time.Hour
	next := newScriptedConsumer()
	rcv, err := newMetricsReceiver(newTestEnv(t).set, cfg, next, scraperhelper.WithTickerChannel(make(chan time.Time)))
	require.NoError(t, err)
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no Pull within 30 s")
	}

	done := make(chan error, 1)
	go func() { done <- rcv.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown waited for the in-flight scrape")
	}
	assert.Empty(t, next.batchLabels())
	assert.Empty(t, next.calls, "an empty scrape is not forwarded to the pipeline")
}
