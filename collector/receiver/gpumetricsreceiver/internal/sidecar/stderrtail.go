package sidecar

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
)

const (
	// stderrTailLines is how many of the sidecar's last stderr lines a start error quotes.
	stderrTailLines = 5
	// stderrTailLineBytes caps one quoted line (the rest of a longer line is dropped).
	stderrTailLineBytes = 1024
)

// stderrTail keeps the last stderrTailLines lines written to it, for ClientConfig.Stderr:
// go-plugin copies each line of the sidecar's stderr there (the line, then "\n", in separate
// writes; a line longer than its buffer arrives in pieces) before it logs it. Memory is bounded
// by stderrTailLines × stderrTailLineBytes whatever the sidecar writes. Safe for concurrent use.
type stderrTail struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
}

// Write appends p; complete lines are kept, the oldest dropped.
func (t *stderrTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		chunk := rest
		if i >= 0 {
			chunk = rest[:i]
		}
		if room := stderrTailLineBytes - len(t.partial); room > 0 {
			t.partial = append(t.partial, chunk[:min(len(chunk), room)]...)
		}
		if i < 0 {
			break
		}
		t.push(string(t.partial))
		t.partial = t.partial[:0]
		rest = rest[i+1:]
	}
	return len(p), nil
}

func (t *stderrTail) push(line string) {
	if strings.TrimSpace(line) == "" {
		return
	}
	t.lines = append(t.lines, line)
	if len(t.lines) > stderrTailLines {
		t.lines = append(t.lines[:0], t.lines[len(t.lines)-stderrTailLines:]...)
	}
}

// Lines returns the kept lines (and an unterminated last one), oldest first, as a reader would
// want them quoted: an hclog JSON line becomes its @message, a level prefix such as "[ERROR] " is
// removed.
func (t *stderrTail) Lines() []string {
	t.mu.Lock()
	raw := append([]string(nil), t.lines...)
	if strings.TrimSpace(string(t.partial)) != "" {
		raw = append(raw, string(t.partial))
	}
	t.mu.Unlock()
	if len(raw) > stderrTailLines {
		raw = raw[len(raw)-stderrTailLines:]
	}
	out := make([]string, 0, len(raw))
	for _, line := range raw {
		out = append(out, readable(line))
	}
	return out
}

// levelPrefixes are the prefixes go-plugin reads a plain line's level from (client.go logStderr).
var levelPrefixes = []string{"[TRACE]", "[DEBUG]", "[INFO]", "[WARN]", "[ERROR]"}

// readable returns the message of an hclog JSON line, or line without its level prefix.
func readable(line string) string {
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "{") {
		var entry struct {
			Message string `json:"@message"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Message != "" {
			return entry.Message
		}
	}
	for _, prefix := range levelPrefixes {
		if strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(line[len(prefix):])
		}
	}
	return line
}
