package sidecar

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// write feeds w the way go-plugin's logStderr does: each line, then "\n", in separate writes.
func write(t *stderrTail, lines ...string) {
	for _, line := range lines {
		_, _ = t.Write([]byte(line))
		_, _ = t.Write([]byte{'\n'})
	}
}

func TestStderrTailKeepsTheLastLinesReadable(t *testing.T) {
	tail := &stderrTail{}
	write(tail,
		"one", "", "two",
		`{"@level":"error","@message":"gpumetrics: 'runtime.simulate': no such profile","@timestamp":"2026-01-01T00:00:00.000000Z"}`,
		"[ERROR] gpumetrics: 'runtime.batch_interval_s' (from GPUMETRICS_BATCH_INTERVAL_S='soon'): bad",
		"[WARN]  2026-01-01T00:00:00.000000Z gpumetrics.runtime.sidecar: SIMULATED GPUs",
		`{"not hclog": true}`,
	)
	_, _ = tail.Write([]byte("unterminated"))
	assert.Equal(t, []string{
		"gpumetrics: 'runtime.simulate': no such profile",
		"gpumetrics: 'runtime.batch_interval_s' (from GPUMETRICS_BATCH_INTERVAL_S='soon'): bad",
		"2026-01-01T00:00:00.000000Z gpumetrics.runtime.sidecar: SIMULATED GPUs",
		`{"not hclog": true}`,
		"unterminated",
	}, tail.Lines(), "the last 5 non-blank lines, oldest first")
}

func TestStderrTailIsBoundedWhateverIsWritten(t *testing.T) {
	tail := &stderrTail{}
	huge := strings.Repeat("x", 10*stderrTailLineBytes)
	for range 1000 {
		// go-plugin hands a line longer than its buffer over in pieces, then the newline
		_, _ = tail.Write([]byte(huge[:len(huge)/2]))
		_, _ = tail.Write([]byte(huge[len(huge)/2:] + "\n"))
	}
	lines := tail.Lines()
	assert.Len(t, lines, stderrTailLines)
	for _, line := range lines {
		assert.Len(t, line, stderrTailLineBytes)
	}
	assert.LessOrEqual(t, cap(tail.partial), 2*stderrTailLineBytes)
}
