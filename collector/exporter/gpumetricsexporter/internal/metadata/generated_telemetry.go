package metadata

import (
	"errors"
	"sync"

	"go.opentelemetry.io/otel/metric"

	"go.opentelemetry.io/collector/component"
)

// TelemetryBuilder holds the exporter's internal telemetry instruments (the Collector's own
// metrics). All are observable: register a callback for each with its Register...Callback
// method, and call Shutdown to unregister them.
type TelemetryBuilder struct {
	meter         metric.Meter
	mu            sync.Mutex
	registrations []metric.Registration

	// GpumetricsExporterProcessesDeclared: declarations the sidecar accepted ({declaration}).
	GpumetricsExporterProcessesDeclared metric.Int64ObservableCounter
	// GpumetricsExporterProcessesUnchanged: resources already declared unchanged ({resource}).
	GpumetricsExporterProcessesUnchanged metric.Int64ObservableCounter
	// GpumetricsExporterDeclarationsFailed: resources not declared, by `reason` ({declaration}).
	GpumetricsExporterDeclarationsFailed metric.Int64ObservableCounter
	// GpumetricsExporterProcessesExited: declarations released, by `reason` ({process}).
	GpumetricsExporterProcessesExited metric.Int64ObservableCounter
	// GpumetricsExporterProcesses: processes held ({process}).
	GpumetricsExporterProcesses metric.Int64ObservableGauge
	// GpumetricsExporterQueueSize: processes whose declaration or exit waits ({process}).
	GpumetricsExporterQueueSize metric.Int64ObservableGauge
	// GpumetricsExporterResyncs: resynchronisations completed ({resync}).
	GpumetricsExporterResyncs metric.Int64ObservableCounter
	// GpumetricsExporterStreamFailures: declaration streams that failed ({failure}).
	GpumetricsExporterStreamFailures metric.Int64ObservableCounter
}

// NewTelemetryBuilder creates the instruments from settings.MeterProvider under ScopeName.
// Instrument names carry the Collector's "otelcol_" prefix, as mdatagen's output does.
func NewTelemetryBuilder(settings component.TelemetrySettings) (*TelemetryBuilder, error) {
	b := TelemetryBuilder{meter: settings.MeterProvider.Meter(ScopeName)}
	var errs, err error
	counter := func(name, description, unit string) metric.Int64ObservableCounter {
		var c metric.Int64ObservableCounter
		c, err = b.meter.Int64ObservableCounter(name, metric.WithDescription(description), metric.WithUnit(unit))
		errs = errors.Join(errs, err)
		return c
	}
	gauge := func(name, description, unit string) metric.Int64ObservableGauge {
		var g metric.Int64ObservableGauge
		g, err = b.meter.Int64ObservableGauge(name, metric.WithDescription(description), metric.WithUnit(unit))
		errs = errors.Join(errs, err)
		return g
	}
	b.GpumetricsExporterProcessesDeclared = counter("otelcol_gpumetrics_exporter_processes_declared",
		"Declarations of profiled processes the gpumetrics sidecar accepted.", "{declaration}")
	b.GpumetricsExporterProcessesUnchanged = counter("otelcol_gpumetrics_exporter_processes_unchanged",
		"Profile resources whose process was already declared with the same attributes and start time; nothing was sent for them.", "{resource}")
	b.GpumetricsExporterDeclarationsFailed = counter("otelcol_gpumetrics_exporter_declarations_failed",
		"Profile resources not declared as they arrived, by reason: rejected (the sidecar refused the declaration), capacity (max_processes processes are held), no_pid (no int process.pid attribute), gone (the process had exited before its profile arrived, or proc_root is another pid namespace), mismatch (proc_root shows another process under the pid: another executable or start time; proc_root is not the profiler's pid namespace), invalid_utf8 (a key or string value was not UTF-8: declared all the same, each invalid run of bytes replaced by U+FFFD, so also counted in processes_declared).", "{declaration}")
	b.GpumetricsExporterProcessesExited = counter("otelcol_gpumetrics_exporter_processes_exited",
		"Declarations released, by reason: gone (the pid is no longer in proc_root), restarted (the pid's start time changed: another process), expired (no profile for expire_after).", "{process}")
	b.GpumetricsExporterProcesses = gauge("otelcol_gpumetrics_exporter_processes",
		"Processes the exporter holds declared (replayed to the sidecar after every reconnect).", "{process}")
	b.GpumetricsExporterQueueSize = gauge("otelcol_gpumetrics_exporter_queue_size",
		"Processes whose declaration or exit waits to be sent to the sidecar (every held process while no declaration stream is open).", "{process}")
	b.GpumetricsExporterResyncs = counter("otelcol_gpumetrics_exporter_resyncs",
		"Resynchronisations the sidecar completed (one after every connect or reconnect).", "{resync}")
	b.GpumetricsExporterStreamFailures = counter("otelcol_gpumetrics_exporter_stream_failures",
		"Declaration streams that could not be opened or broke (each is retried after a backoff).", "{failure}")
	return &b, errs
}

// RegisterCallback registers cb to observe the given instruments at every collection.
func (b *TelemetryBuilder) RegisterCallback(cb metric.Callback, instruments ...metric.Observable) error {
	reg, err := b.meter.RegisterCallback(cb, instruments...)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.registrations = append(b.registrations, reg)
	b.mu.Unlock()
	return nil
}

// Shutdown unregisters every callback.
func (b *TelemetryBuilder) Shutdown() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, reg := range b.registrations {
		_ = reg.Unregister()
	}
	b.registrations = nil
}
