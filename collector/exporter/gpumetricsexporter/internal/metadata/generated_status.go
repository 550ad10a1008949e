// Package metadata holds the gpumetrics exporter's identity and internal telemetry, written by
// hand in the shape of mdatagen's output from ../../metadata.yaml (see metadata_test.go).
package metadata

import (
	"go.opentelemetry.io/collector/component"
)

var (
	// Type is the exporter's component type, the key used in Collector configuration files.
	Type = component.MustNewType("gpumetrics")
	// ScopeName is the instrumentation scope of the exporter's internal telemetry.
	ScopeName = "github.com/gpumetrics/gpumetrics/collector/exporter/gpumetricsexporter"
)

const (
	// ProfilesStability is the stability level of the exporter's profiles signal.
	ProfilesStability = component.StabilityLevelDevelopment
)
