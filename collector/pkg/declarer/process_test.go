package declarer

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/proto"
)

func decodeResource(t *testing.T, b []byte) *resourcepb.Resource {
	t.Helper()
	var r resourcepb.Resource
	require.NoError(t, proto.Unmarshal(b, &r))
	return &r
}

func TestEncodeResourceKeepsEveryValueTypeSorted(t *testing.T) {
	m := pcommon.NewMap()
	m.PutStr("process.executable.name", "python3.11")
	m.PutInt("process.pid", 4242)
	m.PutDouble("ratio", 0.5)
	m.PutBool("flag", true)
	m.PutEmptyBytes("raw").FromRaw([]byte{0, 0xff})
	s := m.PutEmptySlice("list")
	s.AppendEmpty().SetStr("a")
	s.AppendEmpty().SetInt(2)
	m.PutEmptyMap("nested").PutStr("z", "y")
	m.PutEmpty("empty")

	b, err := EncodeResource(m)
	require.NoError(t, err)
	str := func(v string) *commonpb.AnyValue {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}
	}
	want := &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
		{Key: "empty", Value: &commonpb.AnyValue{}},
		{Key: "flag", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}},
		{Key: "list", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{
			str("a"), {Value: &commonpb.AnyValue_IntValue{IntValue: 2}},
		}}}}},
		{Key: "nested", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{Values: []*commonpb.KeyValue{{Key: "z", Value: str("y")}}}}}},
		{Key: "process.executable.name", Value: str("python3.11")},
		{Key: "process.pid", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: 4242}}},
		{Key: "ratio", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: 0.5}}},
		{Key: "raw", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: []byte{0, 0xff}}}},
	}}
	got := decodeResource(t, b)
	assert.Truef(t, proto.Equal(want, got), "want %v\ngot  %v", want, got)
}

func TestEncodeResourceOrderDoesNotMatterAndFirstDuplicateWins(t *testing.T) {
	a := pcommon.NewMap()
	a.PutStr("process.environment_variable.OTEL_SERVICE_NAME", "gpu-trainer")
	a.PutStr("process.environment_variable.OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=recording")
	b := pcommon.NewMap()
	b.PutStr("process.environment_variable.OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=recording")
	b.PutStr("process.environment_variable.OTEL_SERVICE_NAME", "gpu-trainer")
	ea, err := EncodeResource(a)
	require.NoError(t, err)
	eb, err := EncodeResource(b)
	require.NoError(t, err)
	assert.Equal(t, ea, eb, "the eBPF profiler emits env vars in Go map order: the encoding must not depend on it")

	// pdata keeps a key given twice on the wire; Get reads the first, and so does the encoding.
	md, err := (&pmetric.JSONUnmarshaler{}).UnmarshalMetrics([]byte(`{"resourceMetrics":[{"resource":{"attributes":[
		{"key":"k","value":{"stringValue":"first"}},{"key":"k","value":{"stringValue":"second"}}]}}]}`))
	require.NoError(t, err)
	dup := md.ResourceMetrics().At(0).Resource().Attributes()
	require.Equal(t, 2, dup.Len())
	raw := decodeResource(t, mustEncode(t, dup)).GetAttributes()
	require.Len(t, raw, 1)
	assert.Equal(t, "first", raw[0].GetValue().GetStringValue())

	empty, err := EncodeResource(pcommon.NewMap())
	require.NoError(t, err)
	assert.Empty(t, empty)
}

func mustEncode(t *testing.T, m pcommon.Map) []byte {
	t.Helper()
	b, err := EncodeResource(m)
	require.NoError(t, err)
	return b
}

func TestFingerprint(t *testing.T) {
	res := pcommon.NewMap()
	res.PutInt("process.pid", 7)
	base := Process{PID: 7, StartTimeTicks: 100, Resource: res, Environment: []EnvVar{{"OTEL_B", []byte("2")}, {"OTEL_A", []byte("1")}}}
	fp := Fingerprint
	same := base
	same.Environment = []EnvVar{{"OTEL_A", []byte("1")}, {"OTEL_B", []byte("2")}}
	assert.Equal(t, fp(base), fp(same), "environment order does not count")

	restarted := base
	restarted.StartTimeTicks = 101
	assert.NotEqual(t, fp(base), fp(restarted), "a new start time is a new process")

	otherEnv := base
	otherEnv.Environment = []EnvVar{{"OTEL_A", []byte("1")}, {"OTEL_B", []byte("3")}}
	assert.NotEqual(t, fp(base), fp(otherEnv))

	res2 := pcommon.NewMap()
	res2.PutInt("process.pid", 7)
	res2.PutStr("container.id", "c65dedadcb5294cd8b41e7ae6da375613837b0ca7c004ca7be621733b8e1e30b")
	otherRes := base
	otherRes.Resource = res2
	assert.NotEqual(t, fp(base), fp(otherRes))

	withCtx := base
	withCtx.ProcessContext = []byte{0x0a, 0x00}
	assert.NotEqual(t, fp(base), fp(withCtx))

	reordered := pcommon.NewMap()
	reordered.PutStr("container.id", "c65dedadcb5294cd8b41e7ae6da375613837b0ca7c004ca7be621733b8e1e30b")
	reordered.PutInt("process.pid", 7)
	sameRes := otherRes
	sameRes.Resource = reordered
	assert.Equal(t, fp(otherRes), fp(sameRes), "attribute order does not count")

	typed := pcommon.NewMap()
	typed.PutStr("process.pid", "7")
	stringPID := base
	stringPID.Resource = typed
	assert.NotEqual(t, fp(base), fp(stringPID), "the value's type counts")

	nested := func(vals ...int64) Process {
		m := pcommon.NewMap()
		s := m.PutEmptySlice("list")
		for _, v := range vals {
			s.AppendEmpty().SetInt(v)
		}
		return Process{PID: 7, Resource: m}
	}
	assert.NotEqual(t, fp(nested(1, 2)), fp(nested(2, 1)), "a slice's order counts")

	_, err := newEntry(Process{}, 0)
	require.ErrorIs(t, err, ErrInvalidPID)
}

func writeStat(t *testing.T, root string, pid, content string) {
	t.Helper()
	dir := filepath.Join(root, pid)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "stat"), []byte(content), 0o644))
}

func TestStartTimeTicks(t *testing.T) {
	root := t.TempDir()
	// A command name with spaces and parentheses: fields are counted after the last ')'.
	writeStat(t, root, "42", "42 (my (odd) cmd) S 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 12345678 300 18446744073709551615\n")
	writeStat(t, root, "43", "43 (short) S 1 2 3\n")
	writeStat(t, root, "44", "44 no parenthesis\n")
	writeStat(t, root, "45", "45 (x) S 1 45 45 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 soon 1 2\n")

	got, err := StartTimeTicks(root, 42)
	require.NoError(t, err)
	assert.Equal(t, uint64(987654), got)

	_, err = StartTimeTicks(root, 43)
	require.ErrorContains(t, err, "43/stat: 4 fields after the command name, want at least 20")
	_, err = StartTimeTicks(root, 44)
	require.ErrorContains(t, err, "no ')' after the command name")
	_, err = StartTimeTicks(root, 45)
	require.ErrorContains(t, err, `field 22 (starttime) "soon" is not a number`)
	_, err = StartTimeTicks(root, 46)
	require.ErrorIs(t, err, fs.ErrNotExist)

	// The real procfs: this process is there and has a start time.
	self, err := StartTimeTicks("/proc", uint32(os.Getpid()))
	require.NoError(t, err)
	assert.Positive(t, self)
	assert.False(t, errors.Is(err, fs.ErrNotExist))
}
