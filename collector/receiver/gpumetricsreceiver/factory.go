// Package gpumetricsreceiver is an OpenTelemetry Collector receiver (type `gpumetrics`) that pulls
// OTLP metrics from the gpumetrics sidecar over gpumetrics.v1.MetricsPullService and, in a logs
// pipeline, its GPU events as OTLP logs over gpumetrics.v1.LogsPullService; the sidecar is started
// as a go-plugin subprocess or reached at its address (one sidecar for both signals), and each
// batch is acknowledged only after its pipeline accepted it. See docs/collector.md.
package gpumetricsreceiver

import (
	"context"
	"errors"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configtls"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/scraper"
	"go.opentelemetry.io/collector/scraper/scraperhelper"

	"github.com/gpumetrics/gpumetrics/collector/internal/sidecarconn"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
)

// errConfigType is returned when the factory is handed a configuration of another type.
var errConfigType = errors.New("gpumetrics receiver: configuration is not a *gpumetricsreceiver.Config")

// NewFactory returns the factory of the `gpumetrics` receiver.
func NewFactory() receiver.Factory {
	return receiver.NewFactory(
		metadata.Type,
		createDefaultConfig,
		receiver.WithMetrics(createMetrics, metadata.MetricsStability),
		receiver.WithLogs(createLogs, metadata.LogsStability),
	)
}

// createDefaultConfig returns the defaults: no mode chosen (set `command` or `endpoint`), a 10 s
// collection interval with an explicit 10 s scrape timeout, a 30 s plugin start timeout, TLS on
// in remote mode over TCP (a unix socket endpoint is always plaintext), at most 10 pulls per
// scrape, a 64 MiB receive limit, and a Pull answered UNAVAILABLE retried within the scrape
// (100 ms doubling to 1 s, ±20 %).
func createDefaultConfig() component.Config {
	controller := scraperhelper.NewDefaultControllerConfig()
	controller.CollectionInterval = defaultCollectionInterval
	controller.Timeout = defaultTimeout
	return &Config{
		ControllerConfig:  controller,
		StartTimeout:      defaultStartTimeout,
		ClientSettings:    sidecarconn.ClientSettings{TLS: configtls.NewDefaultClientConfig()},
		MaxPullsPerScrape: defaultMaxPullsPerScrape,
		MaxRecvMsgSizeMiB: defaultMaxRecvMsgSizeMiB,
		RetryOnFailure:    defaultRetryConfig(),
	}
}

func createMetrics(_ context.Context, set receiver.Settings, cfg component.Config, next consumer.Metrics) (receiver.Metrics, error) {
	c, ok := cfg.(*Config)
	if !ok {
		return nil, errConfigType
	}
	return newMetricsReceiver(set, c, next)
}

func createLogs(_ context.Context, set receiver.Settings, cfg component.Config, next consumer.Logs) (receiver.Logs, error) {
	c, ok := cfg.(*Config)
	if !ok {
		return nil, errConfigType
	}
	return newLogsReceiver(set, c, next)
}

// newMetricsReceiver builds the scraper and the standard scraper controller around it. The
// controller is given an acknowledging consumer (see ackingConsumer) in front of next, so a batch
// is acknowledged to the sidecar only once next accepted it. The scraper is shared with a logs
// receiver of the same configuration (shared.go). options are passed to the controller after
// these (tests drive scrapes with their own scraperhelper.WithTickerChannel).
func newMetricsReceiver(set receiver.Settings, cfg *Config, next consumer.Metrics, options ...scraperhelper.ControllerOption) (receiver.Metrics, error) {
	l, err := acquireScraper(set, cfg)
	if err != nil {
		return nil, err
	}
	s := l.shared.s
	finalAck := func(ctx context.Context) { s.finalAckNow(ctx, &s.cursor, metricsSignal(pmetric.NewMetrics())) }
	sc, err := scraper.NewMetrics(s.scrape, scraper.WithStart(l.start),
		scraper.WithShutdown(func(ctx context.Context) error { return l.shutdown(ctx, finalAck) }))
	if err != nil {
		return nil, err
	}
	options = append([]scraperhelper.ControllerOption{
		scraperhelper.AddMetricsScraper(metadata.Type, sc),
	}, options...)
	controller, err := scraperhelper.NewMetricsController(&cfg.ControllerConfig, set, &ackingConsumer{next: next, scraper: s}, options...)
	if err != nil {
		return nil, err
	}
	return &metricsReceiver{Metrics: controller, scraper: s}, nil
}

// metricsReceiver is the scraper controller, with a Shutdown that first ends an in-flight scrape
// (a Pull waiting for a sidecar that is down would otherwise hold Shutdown for up to `timeout`).
type metricsReceiver struct {
	receiver.Metrics
	scraper *pullScraper
}

// Shutdown ends any in-flight scrape, then shuts the controller and the scraper down.
func (r *metricsReceiver) Shutdown(ctx context.Context) error {
	r.scraper.stopScrape()
	return r.Metrics.Shutdown(ctx)
}
