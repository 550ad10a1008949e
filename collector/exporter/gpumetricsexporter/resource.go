package gpumetricsexporter

import (
	"math"
	"regexp"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/gpumetrics/gpumetrics/collector/pkg/declarer"
)

const (
	// attrPID is the semconv process.pid resource attribute (int) that keys a declaration.
	attrPID = "process.pid"
	// envPrefix starts the semconv process.environment_variable.<NAME> attributes; the eBPF
	// profiler adds one per name listed in its -env-vars / include_env_vars.
	envPrefix = "process.environment_variable."
)

// envNamePattern selects the variables this exporter declares in `environment`: the OTEL_* ones
// (what identity.mode: enriched reads). The sidecar accepts any name without '=' or NUL
// (docs/protocol.md); the others reach it in profiler_resource.
var envNamePattern = regexp.MustCompile(`^OTEL_[A-Za-z0-9_]*$`)

// processPID returns the resource's process.pid when it is an int in 1..2^32-1 (semconv types it
// int; a string pid would not join with the sidecar's int process.pid).
func processPID(attrs pcommon.Map) (uint32, bool) {
	v, ok := attrs.Get(attrPID)
	if !ok || v.Type() != pcommon.ValueTypeInt {
		return 0, false
	}
	pid := v.Int()
	if pid < 1 || pid > math.MaxUint32 {
		return 0, false
	}
	return uint32(pid), true
}

// environment returns the OTEL_* variables among the resource's
// process.environment_variable.<NAME> attributes (string values without NUL), for the
// declaration's `environment`; other names stay in the resource (profiler_resource) only.
func environment(attrs pcommon.Map) []declarer.EnvVar {
	var env []declarer.EnvVar
	attrs.Range(func(k string, v pcommon.Value) bool {
		name, ok := strings.CutPrefix(k, envPrefix)
		if !ok || !envNamePattern.MatchString(name) || v.Type() != pcommon.ValueTypeStr {
			return true
		}
		if s := v.Str(); !strings.ContainsRune(s, 0) {
			env = append(env, declarer.EnvVar{Name: name, Value: []byte(s)})
		}
		return true
	})
	return env
}
