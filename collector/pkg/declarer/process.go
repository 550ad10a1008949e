package declarer

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"go.opentelemetry.io/collector/pdata/pcommon"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/proto"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// Process is what an agent declares about one process (gpumetrics.v1.ProcessDeclaration).
type Process struct {
	// PID is the process id in the host pid namespace (1..pid_max), the pid NVML reports.
	PID uint32
	// StartTimeTicks is field 22 (starttime) of /proc/<pid>/stat, in clock ticks since boot
	// (see StartTimeTicks); with PID it identifies the process, so a reused pid never inherits
	// a dead process's identity. 0 = unknown: the sidecar then matches on PID alone.
	StartTimeTicks uint64
	// Resource is the set of resource attributes the agent puts on this process's profiles,
	// e.g. process.pid (int), process.executable.name/path, container.id. It is encoded at
	// Declare time as an opentelemetry.proto.resource.v1.Resource (keys sorted; of a key given
	// twice the first is kept, as pcommon.Map.Get reads it), so the caller may reuse the map
	// afterwards. Every value type of pcommon.Value is kept as is; keys and strings that are not
	// UTF-8 (which a protobuf string cannot carry) follow ToValidUTF8's rule.
	Resource pcommon.Map
	// SchemaURL is the schema URL of Resource: the schema_url of the ResourceProfiles it came
	// from (e.g. https://opentelemetry.io/schemas/1.37.0), or "" for none. The sidecar puts it
	// on the process's ResourceMetrics; it accepts at most 2048 bytes.
	SchemaURL string
	// Environment is the process's captured environment variables (raw bytes from
	// /proc/<pid>/environ), e.g. OTEL_SERVICE_NAME. The sidecar accepts non-empty names without
	// '=' or NUL, unique, values without NUL (docs/protocol.md): a declaration that breaks this
	// is rejected whole.
	Environment []EnvVar
	// ProcessContext is the OTEP 4719 process context payload (a serialized
	// opentelemetry.proto.processcontext.v1development.ProcessContext) when the agent captured
	// one; nil otherwise.
	ProcessContext []byte
}

// EnvVar is one captured environment variable.
type EnvVar struct {
	Name  string
	Value []byte
}

// ErrInvalidPID is returned by Declare for PID 0.
var ErrInvalidPID = errors.New("declarer: pid must be at least 1")

// entry is one process as the client holds it: the declaration to send and its fingerprint.
type entry struct {
	decl *gpumetricsv1.ProcessDeclaration
	fp   uint64
}

// newEntry encodes p as the declaration the sidecar receives; fp is Fingerprint(p).
func newEntry(p Process, fp uint64) (*entry, error) {
	if p.PID == 0 {
		return nil, ErrInvalidPID
	}
	res, err := EncodeResource(p.Resource)
	if err != nil {
		return nil, err
	}
	env := make([]*gpumetricsv1.EnvironmentVariable, len(p.Environment))
	for i, v := range p.Environment {
		env[i] = &gpumetricsv1.EnvironmentVariable{Name: v.Name, Value: bytes.Clone(v.Value)}
	}
	slices.SortStableFunc(env, func(a, b *gpumetricsv1.EnvironmentVariable) int { return cmp.Compare(a.Name, b.Name) })
	return &entry{
		decl: &gpumetricsv1.ProcessDeclaration{
			Pid:              p.PID,
			StartTimeTicks:   p.StartTimeTicks,
			ProcessContext:   bytes.Clone(p.ProcessContext),
			Environment:      env,
			ProfilerResource: res,
			// the sidecar's own protobuf decoder refuses a string that is not UTF-8
			ProfilerResourceSchemaUrl: ToValidUTF8(p.SchemaURL),
		},
		fp: fp,
	}, nil
}

// EncodeResource serializes attrs as an opentelemetry.proto.resource.v1.Resource, the form of
// ProcessDeclaration.profiler_resource: keys sorted (OTLP gives attribute order no meaning, and a
// fixed order makes equal maps encode equally), the first of a duplicated key kept, values of
// every type as they are (string, int, double, bool, bytes, arrays, maps; an empty value stays
// an AnyValue without a value), except that keys and strings that are not UTF-8 follow
// ToValidUTF8's rule (ValidUTF8 tells whether any does). An empty map encodes as empty bytes.
func EncodeResource(attrs pcommon.Map) ([]byte, error) {
	if attrs.Len() == 0 {
		return nil, nil
	}
	res := &resourcepb.Resource{Attributes: keyValues(attrs)}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("encoding the resource: %w", err)
	}
	return b, nil
}

// keyValues converts a pcommon.Map to sorted OTLP key-values, keeping the first of duplicates.
func keyValues(m pcommon.Map) []*commonpb.KeyValue {
	out := make([]*commonpb.KeyValue, 0, m.Len())
	seen := make(map[string]struct{}, m.Len())
	m.Range(func(k string, v pcommon.Value) bool {
		k = ToValidUTF8(k)
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			out = append(out, &commonpb.KeyValue{Key: k, Value: anyValue(v)})
		}
		return true
	})
	slices.SortStableFunc(out, func(a, b *commonpb.KeyValue) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// anyValue converts one pcommon.Value to its OTLP AnyValue.
func anyValue(v pcommon.Value) *commonpb.AnyValue {
	switch v.Type() {
	case pcommon.ValueTypeStr:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: ToValidUTF8(v.Str())}}
	case pcommon.ValueTypeInt:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.Int()}}
	case pcommon.ValueTypeDouble:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.Double()}}
	case pcommon.ValueTypeBool:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.Bool()}}
	case pcommon.ValueTypeBytes:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: bytes.Clone(v.Bytes().AsRaw())}}
	case pcommon.ValueTypeSlice:
		s := v.Slice()
		values := make([]*commonpb.AnyValue, s.Len())
		for i := range s.Len() {
			values[i] = anyValue(s.At(i))
		}
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: values}}}
	case pcommon.ValueTypeMap:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{Values: keyValues(v.Map())}}}
	default: // pcommon.ValueTypeEmpty
		return &commonpb.AnyValue{}
	}
}

// StartTimeTicks reads field 22 (starttime, clock ticks since boot) of <procRoot>/<pid>/stat,
// parsed after the last ')' so that a command name holding spaces or parentheses cannot shift
// the fields (proc(5)). procRoot is "/proc", or e.g. "/host/proc" in a container that mounts the
// host's procfs. An error wrapping fs.ErrNotExist means the process is gone (or not visible in
// procRoot's pid namespace); a malformed file gives an error naming it.
func StartTimeTicks(procRoot string, pid uint32) (uint64, error) {
	path := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "stat")
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || isESRCH(err) {
			return 0, fmt.Errorf("%s: %w", path, fs.ErrNotExist)
		}
		return 0, err
	}
	return parseStartTime(path, b)
}

// parseStartTime returns field 22 of a /proc/<pid>/stat line.
func parseStartTime(path string, b []byte) (uint64, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("%s: no ')' after the command name", path)
	}
	// Fields after ')' start at field 3 (state); starttime is field 22, the 20th of them.
	const want = 22 - 3
	rest := b[end+1:]
	n := 0
	for {
		rest = bytes.TrimLeft(rest, " \t\n")
		if len(rest) == 0 {
			return 0, fmt.Errorf("%s: %d fields after the command name, want at least %d", path, n, want+1)
		}
		field := rest
		if i := bytes.IndexAny(rest, " \t\n"); i >= 0 {
			field, rest = rest[:i], rest[i:]
		} else {
			rest = nil
		}
		if n == want {
			v, err := strconv.ParseUint(string(field), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: field 22 (starttime) %q is not a number", path, field)
			}
			return v, nil
		}
		n++
	}
}

// isESRCH reports a read of a process's file that raced with its exit.
func isESRCH(err error) bool { return errors.Is(err, syscall.ESRCH) }
