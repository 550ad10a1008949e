package declarer

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
)

// utf8Case is one vector of tests/testdata/identity/invalid_utf8_cases.json, which the sidecar's
// test (tests/identity/test_utf8.py) reads too: both sides must apply one rule.
type utf8Case struct {
	ID       string `json:"id"`
	Input    string `json:"input"`
	Want     string `json:"want"`
	Replaced bool   `json:"replaced"`
}

func utf8Cases(t *testing.T) []utf8Case {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "tests", "testdata", "identity", "invalid_utf8_cases.json"))
	require.NoError(t, err)
	var file struct {
		Cases []utf8Case `json:"cases"`
	}
	require.NoError(t, json.Unmarshal(b, &file))
	require.NotEmpty(t, file.Cases)
	return file.Cases
}

func TestToValidUTF8MatchesTheSharedVectors(t *testing.T) {
	for _, c := range utf8Cases(t) {
		t.Run(c.ID, func(t *testing.T) {
			raw, err := hex.DecodeString(c.Input)
			require.NoError(t, err)
			assert.Equal(t, c.Want, ToValidUTF8(string(raw)))
			m := pcommon.NewMap()
			m.PutStr("k", string(raw))
			assert.Equal(t, !c.Replaced, ValidUTF8(m))
		})
	}
}

// Issue 27 item 2: a profile resource with raw bytes (the eBPF profiler's
// process.environment_variable.* values are what /proc shows) used to fail to encode whole
// ("string field contains invalid UTF-8"), so the process was never declared.
func TestEncodeResourceReplacesWhatIsNotUTF8(t *testing.T) {
	m := pcommon.NewMap()
	m.PutInt("process.pid", 4242)
	m.PutStr("process.environment_variable.LANG_NAME", "caf\xe9")
	m.PutStr("process.executable.path", "/opt/app/cam\xe9")
	m.PutStr("bad.\xff.key", "v")
	m.PutEmptySlice("list").AppendEmpty().SetStr("\xfe\xff")
	m.PutEmptyMap("nested").PutStr("n", "x\x80y")
	assert.False(t, ValidUTF8(m))

	b, err := EncodeResource(m)
	require.NoError(t, err)
	got := map[string]any{}
	for _, kv := range decodeResource(t, b).GetAttributes() {
		v := kv.GetValue()
		switch {
		case v.GetArrayValue() != nil:
			got[kv.GetKey()] = v.GetArrayValue().GetValues()[0].GetStringValue()
		case v.GetKvlistValue() != nil:
			got[kv.GetKey()] = v.GetKvlistValue().GetValues()[0].GetValue().GetStringValue()
		case kv.GetKey() == "process.pid":
			got[kv.GetKey()] = v.GetIntValue()
		default:
			got[kv.GetKey()] = v.GetStringValue()
		}
	}
	assert.Equal(t, map[string]any{
		"process.pid":                            int64(4242),
		"process.environment_variable.LANG_NAME": "caf\uFFFD",
		"process.executable.path":                "/opt/app/cam\uFFFD",
		"bad.\uFFFD.key":                         "v",
		"list":                                   "\uFFFD",
		"nested":                                 "x\uFFFDy",
	}, got)

	valid := pcommon.NewMap()
	valid.PutStr("k", "caf\u00e9 \uFFFD")
	assert.True(t, ValidUTF8(valid), "a genuine U+FFFD is valid UTF-8")
}

// Issue 27 item 5: the schema URL travels with the declaration and is part of what changes it.
func TestSchemaURLIsDeclaredAndFingerprinted(t *testing.T) {
	res := pcommon.NewMap()
	res.PutInt("process.pid", 7)
	p := Process{PID: 7, Resource: res, SchemaURL: "https://opentelemetry.io/schemas/1.37.0"}
	e, err := newEntry(p, Fingerprint(p))
	require.NoError(t, err)
	assert.Equal(t, "https://opentelemetry.io/schemas/1.37.0", e.decl.GetProfilerResourceSchemaUrl())

	other := p
	other.SchemaURL = "https://opentelemetry.io/schemas/1.38.0"
	assert.NotEqual(t, Fingerprint(p), Fingerprint(other))
	none := p
	none.SchemaURL = ""
	assert.NotEqual(t, Fingerprint(p), Fingerprint(none))
}
