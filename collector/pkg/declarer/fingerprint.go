package declarer

import (
	"hash/maphash"
	"math"

	"go.opentelemetry.io/collector/pdata/pcommon"
)

// seed keys every fingerprint of this process (fingerprints are compared in memory only).
var seed = maphash.MakeSeed()

// Fingerprint returns a 64-bit hash of everything p declares: the start time, the resource
// attributes (keys, value types and values, nested ones included), its schema URL, the
// environment and the process context. It ignores the order of attributes and of environment variables (OTLP gives
// it no meaning, and the eBPF profiler emits its environment attributes in Go map order), and it
// allocates nothing, so an unchanged process costs no encoding. Two Process values that declare
// the same thing have the same fingerprint within one run of the program; a different one means
// (but for a 2^-64 collision) that something changed. The value is not stable across runs.
func Fingerprint(p Process) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	writeUint(&h, p.StartTimeTicks)
	writeUint(&h, hashMap(p.Resource))
	writeString(&h, p.SchemaURL)
	var env uint64
	for _, v := range p.Environment {
		var e maphash.Hash
		e.SetSeed(seed)
		writeString(&e, v.Name)
		writeUint(&e, uint64(len(v.Value)))
		_, _ = e.Write(v.Value)
		env += e.Sum64() // a sum: the order of the variables does not count
	}
	writeUint(&h, env)
	writeUint(&h, uint64(len(p.ProcessContext)))
	_, _ = h.Write(p.ProcessContext)
	return h.Sum64()
}

// hashMap hashes a map's entries independently of their order (the sum of per-entry hashes).
func hashMap(m pcommon.Map) uint64 {
	var sum uint64
	m.Range(func(k string, v pcommon.Value) bool {
		var h maphash.Hash
		h.SetSeed(seed)
		writeString(&h, k)
		writeValue(&h, v)
		sum += h.Sum64()
		return true
	})
	return sum
}

// writeValue writes a value's type and content (slices in order, maps order-independent).
func writeValue(h *maphash.Hash, v pcommon.Value) {
	_ = h.WriteByte(byte(v.Type()))
	switch v.Type() {
	case pcommon.ValueTypeStr:
		writeString(h, v.Str())
	case pcommon.ValueTypeInt:
		writeUint(h, uint64(v.Int())) //nolint:gosec // the bits, not the number
	case pcommon.ValueTypeDouble:
		writeUint(h, math.Float64bits(v.Double()))
	case pcommon.ValueTypeBool:
		if v.Bool() {
			_ = h.WriteByte(1)
		} else {
			_ = h.WriteByte(0)
		}
	case pcommon.ValueTypeBytes:
		b := v.Bytes().AsRaw()
		writeUint(h, uint64(len(b)))
		_, _ = h.Write(b)
	case pcommon.ValueTypeSlice:
		s := v.Slice()
		writeUint(h, uint64(s.Len()))
		for i := range s.Len() {
			writeValue(h, s.At(i))
		}
	case pcommon.ValueTypeMap:
		writeUint(h, hashMap(v.Map()))
	case pcommon.ValueTypeEmpty:
	}
}

func writeString(h *maphash.Hash, s string) {
	writeUint(h, uint64(len(s)))
	_, _ = h.WriteString(s)
}

func writeUint(h *maphash.Hash, v uint64) {
	var b [8]byte
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	_, _ = h.Write(b[:])
}
