// Package gpumetricsexporter is an OpenTelemetry Collector profiles exporter (type `gpumetrics`)
// that declares every profiled process to the gpumetrics sidecar
// (gpumetrics.v1.ProfilerIntegrationService), so the process's GPU metrics land on the same
// resource as its profiles. Placed in a profiles pipeline beside the real profiles exporter, it
// takes each ResourceProfiles' resource as it reaches it, records it as the latest declaration
// of its process.pid and returns at once; one goroutine streams what changed to the sidecar
// (collector/pkg/declarer). See docs/collector.md.
package gpumetricsexporter

import (
	"context"
	"errors"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configtls"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/exporterhelper"
	"go.opentelemetry.io/collector/exporter/exporterhelper/xexporterhelper"
	"go.opentelemetry.io/collector/exporter/xexporter"

	"github.com/gpumetrics/gpumetrics/collector/exporter/gpumetricsexporter/internal/metadata"
	"github.com/gpumetrics/gpumetrics/collector/internal/sidecarconn"
)

// errConfigType is returned when the factory is handed a configuration of another type.
var errConfigType = errors.New("gpumetrics exporter: configuration is not a *gpumetricsexporter.Config")

// NewFactory returns the factory of the `gpumetrics` profiles exporter.
func NewFactory() xexporter.Factory {
	return xexporter.NewFactory(
		metadata.Type,
		createDefaultConfig,
		xexporter.WithProfiles(createProfiles, metadata.ProfilesStability),
	)
}

// createDefaultConfig returns the defaults: no endpoint (it must be set), TLS on over TCP (a unix
// socket endpoint is always plaintext), start times from /proc, at most 32768 processes, exit
// checks every 10 s, expiry after 30 min without a profile.
func createDefaultConfig() component.Config {
	return &Config{
		ClientSettings:    sidecarconn.ClientSettings{TLS: configtls.NewDefaultClientConfig()},
		ProcRoot:          defaultProcRoot,
		MaxProcesses:      defaultMaxProcesses,
		ExitCheckInterval: defaultExitCheckInterval,
		ExpireAfter:       defaultExpireAfter,
	}
}

func createProfiles(ctx context.Context, set exporter.Settings, cfg component.Config) (xexporter.Profiles, error) {
	c, ok := cfg.(*Config)
	if !ok {
		return nil, errConfigType
	}
	e, err := newProfilesExporter(set, c)
	if err != nil {
		return nil, err
	}
	// No queue, no retry and no timeout: consume only records, it never waits on the sidecar.
	return xexporterhelper.NewProfiles(ctx, set, cfg, e.consumeProfiles,
		exporterhelper.WithStart(e.start),
		exporterhelper.WithShutdown(e.shutdown),
		exporterhelper.WithCapabilities(consumer.Capabilities{MutatesData: false}),
	)
}
