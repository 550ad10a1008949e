// Package metadata holds the gpumetrics receiver's identity and internal telemetry, written by hand
// in the shape of mdatagen's output from ../../metadata.yaml (see metadata_test.go).
package metadata

import (
	"go.opentelemetry.io/collector/component"
)

var (
	// Type is the receiver's component type, the key used in Collector configuration files.
	Type = component.MustNewType("gpumetrics")
	// ScopeName is the instrumentation scope of the receiver's internal telemetry.
	ScopeName = "github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver"
)

const (
	// MetricsStability is the stability level of the receiver's metrics signal.
	MetricsStability = component.StabilityLevelDevelopment
	// LogsStability is the stability level of the receiver's logs signal (GPU events).
	LogsStability = component.StabilityLevelDevelopment
)
