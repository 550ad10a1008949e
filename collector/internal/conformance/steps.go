package conformance

import (
	"encoding/hex"
	"fmt"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
)

// The bodies and answers of the steps (README.md, "Steps" and "Answers").

type appendStep struct {
	Points uint64 `yaml:"points"`
	Count  int    `yaml:"count"`
	Bytes  *int   `yaml:"bytes"`
}

type advanceStep struct {
	Seconds float64 `yaml:"seconds"`
}

type errorWant struct {
	Code    string `yaml:"code"`
	Message string `yaml:"message"`
}

// code returns the gRPC code the want names (INVALID_ARGUMENT, ...).
func (e *errorWant) code() (codes.Code, error) {
	var c codes.Code
	if err := c.UnmarshalJSON([]byte(`"` + e.Code + `"`)); err != nil {
		return 0, fmt.Errorf("error.code %q: %w", e.Code, err)
	}
	return c, nil
}

type pullWant struct {
	Batches                []uint64   `yaml:"batches"`
	More                   bool       `yaml:"more"`
	DroppedDataPoints      uint64     `yaml:"dropped_data_points"`
	DroppedDataPointsTotal uint64     `yaml:"dropped_data_points_total"`
	DroppedLogRecords      uint64     `yaml:"dropped_log_records"`
	DroppedLogRecordsTotal uint64     `yaml:"dropped_log_records_total"`
	DropReasons            []string   `yaml:"drop_reasons"`
	Error                  *errorWant `yaml:"error"`
}

// envValue is an environment value: a string (its UTF-8 bytes) or {hex: "..."}.
type envValue []byte

func (v *envValue) UnmarshalYAML(node *yaml.Node) error {
	if node.Kind == yaml.ScalarNode {
		*v = []byte(node.Value)
		return nil
	}
	var h struct {
		Hex string `yaml:"hex"`
	}
	if err := decodeNode(node, &h); err != nil {
		return err
	}
	b, err := hex.DecodeString(h.Hex)
	*v = b
	return err
}

type envVar struct {
	Name  string   `yaml:"name"`
	Value envValue `yaml:"value"`
}

type process struct {
	PID               uint32    `yaml:"pid"`
	StartTimeTicks    uint64    `yaml:"start_time_ticks"`
	Environment       []envVar  `yaml:"environment"`
	Resource          yaml.Node `yaml:"resource"` // a mapping, kept in order
	ProcessContextHex string    `yaml:"process_context_hex"`
}

type exitEntry struct {
	PID            uint32 `yaml:"pid"`
	StartTimeTicks uint64 `yaml:"start_time_ticks"`
}

type declareStep struct {
	Processes  []process `yaml:"processes"`
	ReplaceAll bool      `yaml:"replace_all"`
	Declarer   *string   `yaml:"declarer"`
}

type exitsStep struct {
	Exits []exitEntry `yaml:"exits"`
}

type openStep struct {
	Stream   string  `yaml:"stream"`
	Declarer *string `yaml:"declarer"`
}

type declareBatch struct {
	Processes []process `yaml:"processes"`
}

type sendStep struct {
	Stream       string        `yaml:"stream"`
	Declare      *process      `yaml:"declare"`
	DeclareBatch *declareBatch `yaml:"declare_batch"`
	Exit         *exitEntry    `yaml:"exit"`
	ResyncBegin  *struct{}     `yaml:"resync_begin"`
	ResyncEnd    *struct{}     `yaml:"resync_end"`
}

type closeStep struct {
	Stream string `yaml:"stream"`
}

type rejectionWant struct {
	Index  uint32 `yaml:"index"`
	PID    uint32 `yaml:"pid"`
	Field  string `yaml:"field"`
	Reason string `yaml:"reason"`
}

type declareWant struct {
	Accepted uint32          `yaml:"accepted"`
	Released uint32          `yaml:"released"`
	Rejected []rejectionWant `yaml:"rejected"`
	Error    *errorWant      `yaml:"error"`
}

type exitsWant struct {
	Released uint32          `yaml:"released"`
	Rejected []rejectionWant `yaml:"rejected"`
	Error    *errorWant      `yaml:"error"`
}

type openWant struct {
	Error *errorWant `yaml:"error"`
}

type sendWant struct {
	Accepted   bool            `yaml:"accepted"`
	Released   uint32          `yaml:"released"`
	Declared   uint32          `yaml:"declared"`
	Rejection  *rejectionWant  `yaml:"rejection"`
	Rejections []rejectionWant `yaml:"rejections"`
}
