package declarer

import (
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/collector/pdata/pcommon"
)

// replacement is U+FFFD REPLACEMENT CHARACTER.
const replacement = "\uFFFD"

// ToValidUTF8 is the one rule for text that is not UTF-8 on its way into an OTLP string (a
// protobuf string must be UTF-8): every maximal run of bytes that are not part of a valid UTF-8
// sequence (RFC 3629) becomes one U+FFFD, valid sequences are kept (strings.ToValidUTF8). The
// OpenTelemetry eBPF profiler puts raw bytes from procfs into its resources (an environment
// value such as "caf\xe9", a Latin-1 executable path); EncodeResource applies this rule to every
// key and string value, and the gpumetrics sidecar applies the same rule to what it reads from
// procfs for the same keys (gpumetrics.identity.utf8), so the two resources stay equal. The
// shared test vectors are tests/testdata/identity/invalid_utf8_cases.json.
func ToValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, replacement)
}

// ValidUTF8 reports whether every key and string value of attrs (nested ones included) is valid
// UTF-8, i.e. whether EncodeResource declares attrs without replacing anything. It allocates
// nothing.
func ValidUTF8(attrs pcommon.Map) bool {
	ok := true
	attrs.Range(func(k string, v pcommon.Value) bool {
		ok = utf8.ValidString(k) && validValue(v)
		return ok
	})
	return ok
}

func validValue(v pcommon.Value) bool {
	switch v.Type() {
	case pcommon.ValueTypeStr:
		return utf8.ValidString(v.Str())
	case pcommon.ValueTypeSlice:
		s := v.Slice()
		for i := range s.Len() {
			if !validValue(s.At(i)) {
				return false
			}
		}
	case pcommon.ValueTypeMap:
		return ValidUTF8(v.Map())
	default:
	}
	return true
}
