package metadata

import (
	"errors"

	"go.opentelemetry.io/otel/metric"

	"go.opentelemetry.io/collector/component"
)

// TelemetryBuilder holds the receiver's internal telemetry instruments (the Collector's own
// metrics, exported by its telemetry pipeline, not by the receiver's metrics pipeline).
type TelemetryBuilder struct {
	// GpumetricsSidecarDroppedDataPoints counts data points the sidecar dropped before this
	// receiver acknowledged them ({datapoint}; source: PullResponse.dropped_data_points).
	GpumetricsSidecarDroppedDataPoints metric.Int64Counter
	// GpumetricsSidecarRestarts counts store epoch changes seen between pulls ({restart}).
	GpumetricsSidecarRestarts metric.Int64Counter
	// GpumetricsSidecarDroppedLogRecords counts log records (GPU events) the sidecar dropped
	// before this receiver acknowledged them ({record}; source:
	// PullLogsResponse.dropped_log_records).
	GpumetricsSidecarDroppedLogRecords metric.Int64Counter
}

// NewTelemetryBuilder creates the instruments from settings.MeterProvider under ScopeName.
// Instrument names carry the Collector's "otelcol_" prefix, as mdatagen's output does.
func NewTelemetryBuilder(settings component.TelemetrySettings) (*TelemetryBuilder, error) {
	meter := settings.MeterProvider.Meter(ScopeName)
	var errs, err error
	builder := TelemetryBuilder{}
	builder.GpumetricsSidecarDroppedDataPoints, err = meter.Int64Counter(
		"otelcol_gpumetrics_sidecar_dropped_data_points",
		metric.WithDescription("Data points the sidecar's store dropped before this receiver acknowledged them, as the sidecar announced in PullResponse.dropped_data_points."),
		metric.WithUnit("{datapoint}"),
	)
	errs = errors.Join(errs, err)
	builder.GpumetricsSidecarRestarts, err = meter.Int64Counter(
		"otelcol_gpumetrics_sidecar_restarts",
		metric.WithDescription("Times the sidecar's store epoch changed between two pulls (the sidecar restarted and its sequences began again); each one resets the acknowledgement cursor."),
		metric.WithUnit("{restart}"),
	)
	errs = errors.Join(errs, err)
	builder.GpumetricsSidecarDroppedLogRecords, err = meter.Int64Counter(
		"otelcol_gpumetrics_sidecar_dropped_log_records",
		metric.WithDescription("Log records (GPU events) the sidecar's log store dropped before this receiver acknowledged them, as the sidecar announced in PullLogsResponse.dropped_log_records."),
		metric.WithUnit("{record}"),
	)
	errs = errors.Join(errs, err)
	return &builder, errs
}
