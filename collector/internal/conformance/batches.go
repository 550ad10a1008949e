package conformance

import (
	"fmt"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/proto"
)

const t0 = 1_700_000_000_000_000_000

func batchResource(seq uint64) *resourcepb.Resource {
	return &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{
		Key:   "conformance.batch",
		Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(seq)}}, //nolint:gosec // small sequences
	}}}
}

// MetricsBatch is the canonical metrics batch of sequence seq with n data points (README.md,
// "Batches"), serialized as protobuf writes it (fields in field-number order), the bytes the
// Python runner stores. It is built as MetricsData, whose wire format is
// ExportMetricsServiceRequest's (both are field 1, repeated ResourceMetrics), so this package
// needs no gRPC-gateway code of the collector service packages.
func MetricsBatch(seq, n uint64) []byte {
	points := make([]*metricspb.NumberDataPoint, n)
	for i := range n {
		points[i] = &metricspb.NumberDataPoint{
			TimeUnixNano: t0 + i,
			Value:        &metricspb.NumberDataPoint_AsInt{AsInt: int64(i)}, //nolint:gosec // small counts
		}
	}
	return marshal(&metricspb.MetricsData{ResourceMetrics: []*metricspb.ResourceMetrics{{
		Resource: batchResource(seq),
		ScopeMetrics: []*metricspb.ScopeMetrics{{Metrics: []*metricspb.Metric{{
			Name: "conformance.value",
			Data: &metricspb.Metric_Gauge{Gauge: &metricspb.Gauge{DataPoints: points}},
		}}}},
	}}})
}

// LogsBatch is the canonical logs batch of sequence seq with n log records (built as LogsData,
// the wire format of ExportLogsServiceRequest).
func LogsBatch(seq, n uint64) []byte {
	records := make([]*logspb.LogRecord, n)
	for i := range n {
		records[i] = &logspb.LogRecord{
			TimeUnixNano: t0 + i,
			EventName:    "conformance.event",
			Body:         &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(i)}}, //nolint:gosec // small counts
		}
	}
	return marshal(&logspb.LogsData{ResourceLogs: []*logspb.ResourceLogs{{
		Resource:  batchResource(seq),
		ScopeLogs: []*logspb.ScopeLogs{{LogRecords: records}},
	}}})
}

// Batch is the canonical batch of service ("pull" or "logs").
func Batch(service string, seq, n uint64) []byte {
	if service == "logs" {
		return LogsBatch(seq, n)
	}
	return MetricsBatch(seq, n)
}

func marshal(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("conformance: marshal: %v", err))
	}
	return b
}
