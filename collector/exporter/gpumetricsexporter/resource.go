package gpumetricsexporter

import (
	"math"
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

// validEnvName is the sidecar's rule for a declared environment variable's name
// (docs/protocol.md): any non-empty name without '=' or NUL, as the profiler captures it.
func validEnvName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "=\x00")
}

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

// environment returns the resource's process.environment_variable.<NAME> attributes (string
// values without NUL, names the sidecar accepts), for the declaration's `environment`; the
// resource itself keeps every attribute as it is.
func environment(attrs pcommon.Map) []declarer.EnvVar {
	var env []declarer.EnvVar
	attrs.Range(func(k string, v pcommon.Value) bool {
		name, ok := strings.CutPrefix(k, envPrefix)
		if !ok || !validEnvName(name) || v.Type() != pcommon.ValueTypeStr {
			return true
		}
		if s := v.Str(); !strings.ContainsRune(s, 0) {
			env = append(env, declarer.EnvVar{Name: name, Value: []byte(s)})
		}
		return true
	})
	return env
}
