package fakesidecar

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// step is one Pull and what the answer must be. The cases mirror the Python BatchStore's tests
// (tests/store/test_batchstore.py), so the fake keeps the real store's rules.
type step struct {
	req        *gpumetricsv1.PullRequest
	wantFirst  uint64
	wantLast   uint64
	wantMore   bool
	wantLabels []string
	wantHeld   int
}

func labels(t *testing.T, b []byte) []string {
	t.Helper()
	req := pmetricotlp.NewExportRequest()
	require.NoError(t, req.UnmarshalProto(b))
	var out []string
	rms := req.Metrics().ResourceMetrics()
	for i := range rms.Len() {
		v, _ := rms.At(i).Resource().Attributes().Get("batch")
		out = append(out, v.AsString())
	}
	return out
}

func pr(consumer string, ack uint64, epoch string, readAfter uint64, maxPoints uint32, ackOnly bool) *gpumetricsv1.PullRequest {
	return &gpumetricsv1.PullRequest{
		Consumer: consumer, AckSequence: ack, AckEpoch: epoch, ReadAfterSequence: readAfter,
		MaxDataPoints: maxPoints, AckOnly: ackOnly,
	}
}

func TestPullRules(t *testing.T) {
	tests := []struct {
		name    string
		batches int // each of 2 points, labelled b1..bn
		steps   []step
	}{
		{
			name: "read ahead drains a backlog, then one ack releases it all", batches: 5,
			steps: []step{
				{req: pr("c", 0, "E", 0, 4, false), wantFirst: 1, wantLast: 2, wantMore: true, wantLabels: []string{"b1", "b2"}, wantHeld: 5},
				{req: pr("c", 0, "E", 2, 4, false), wantFirst: 3, wantLast: 4, wantMore: true, wantLabels: []string{"b3", "b4"}, wantHeld: 5},
				{req: pr("c", 0, "E", 4, 4, false), wantFirst: 5, wantLast: 5, wantLabels: []string{"b5"}, wantHeld: 5},
				{req: pr("c", 5, "E", 5, 4, false), wantHeld: 0},
			},
		},
		{
			name: "an ack past batches skipped with read_after_sequence releases none of them", batches: 4,
			steps: []step{
				{req: pr("c", 0, "E", 2, 0, false), wantFirst: 3, wantLast: 4, wantLabels: []string{"b3", "b4"}, wantHeld: 4},
				{req: pr("c", 4, "E", 0, 0, true), wantMore: true, wantHeld: 4},
				{req: pr("c", 0, "E", 0, 0, false), wantFirst: 1, wantLast: 4, wantLabels: []string{"b1", "b2", "b3", "b4"}, wantHeld: 4},
				{req: pr("c", 4, "E", 4, 0, false), wantHeld: 0},
			},
		},
		{
			name: "reading from the cursor again re-delivers what was not acknowledged", batches: 3,
			steps: []step{
				{req: pr("c", 0, "E", 0, 2, false), wantFirst: 1, wantLast: 1, wantMore: true, wantLabels: []string{"b1"}, wantHeld: 3},
				{req: pr("c", 0, "E", 1, 0, false), wantFirst: 2, wantLast: 3, wantLabels: []string{"b2", "b3"}, wantHeld: 3},
				{req: pr("c", 0, "E", 0, 0, false), wantFirst: 1, wantLast: 3, wantLabels: []string{"b1", "b2", "b3"}, wantHeld: 3},
			},
		},
		{
			name: "read_after_sequence of another epoch is ignored", batches: 3,
			steps: []step{
				{req: pr("c", 0, "old", 2, 0, false), wantFirst: 1, wantLast: 3, wantLabels: []string{"b1", "b2", "b3"}, wantHeld: 3},
				{req: pr("d", 0, "", 2, 0, false), wantFirst: 1, wantLast: 3, wantLabels: []string{"b1", "b2", "b3"}, wantHeld: 3},
			},
		},
		{
			name: "beyond what exists: empty, no more", batches: 3,
			steps: []step{
				{req: pr("c", 0, "E", 3, 0, false), wantHeld: 3},
				{req: pr("c", 0, "E", 99, 0, false), wantHeld: 3},
				{req: pr("c", 0, "E", 1, 0, true), wantMore: true, wantHeld: 3},
			},
		},
		{
			name: "never reads behind the ack cursor", batches: 3,
			steps: []step{
				{req: pr("c", 0, "E", 0, 0, false), wantFirst: 1, wantLast: 3, wantLabels: []string{"b1", "b2", "b3"}, wantHeld: 3},
				{req: pr("c", 2, "E", 1, 0, false), wantFirst: 3, wantLast: 3, wantLabels: []string{"b3"}, wantHeld: 1},
			},
		},
		{
			name: "an ack is clamped to what was sent", batches: 4,
			steps: []step{
				{req: pr("c", 0, "E", 0, 4, false), wantFirst: 1, wantLast: 2, wantMore: true, wantLabels: []string{"b1", "b2"}, wantHeld: 4},
				{req: pr("c", 4, "E", 2, 0, true), wantMore: true, wantHeld: 2},
			},
		},
		{
			name: "an ack from another epoch is ignored", batches: 2,
			steps: []step{
				{req: pr("c", 0, "E", 0, 0, false), wantFirst: 1, wantLast: 2, wantLabels: []string{"b1", "b2"}, wantHeld: 2},
				{req: pr("c", 2, "old", 0, 0, true), wantMore: true, wantHeld: 2},
			},
		},
		{
			name: "a batch is released once every consumer acknowledged it", batches: 2,
			steps: []step{
				{req: pr("a", 0, "E", 0, 0, false), wantFirst: 1, wantLast: 2, wantLabels: []string{"b1", "b2"}, wantHeld: 2},
				{req: pr("b", 0, "E", 0, 2, false), wantFirst: 1, wantLast: 1, wantMore: true, wantLabels: []string{"b1"}, wantHeld: 2},
				{req: pr("a", 2, "E", 0, 0, true), wantHeld: 2},
				{req: pr("b", 1, "E", 1, 0, false), wantFirst: 2, wantLast: 2, wantLabels: []string{"b2"}, wantHeld: 1},
				{req: pr("b", 2, "E", 0, 0, true), wantHeld: 0},
			},
		},
		{
			name: "a single batch over the cap is returned alone", batches: 2,
			steps: []step{
				{req: pr("c", 0, "E", 0, 1, false), wantFirst: 1, wantLast: 1, wantMore: true, wantLabels: []string{"b1"}, wantHeld: 2},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Options{Epoch: "E"})
			for i := range tt.batches {
				s.Append(Gauge("b"+strconv.Itoa(i+1), 2))
			}
			for i, st := range tt.steps {
				resp, err := s.Pull(context.Background(), st.req)
				require.NoError(t, err, "step %d", i)
				assert.Equal(t, "E", resp.GetEpoch(), "step %d", i)
				assert.Equal(t, []uint64{st.wantFirst, st.wantLast}, []uint64{resp.GetFirstSequence(), resp.GetLastSequence()}, "step %d", i)
				assert.Equal(t, st.wantMore, resp.GetMore(), "step %d", i)
				assert.Equal(t, st.wantLabels, labels(t, resp.GetExportMetricsServiceRequest()), "step %d", i)
				assert.Equal(t, uint64(2*len(st.wantLabels)), resp.GetDataPoints(), "step %d", i)
				assert.Equal(t, st.wantHeld, s.Held(), "step %d", i)
			}
		})
	}
}

func TestPullBeforeTheFirstBatchIsUnavailable(t *testing.T) {
	s := New(Options{})
	_, err := s.Pull(context.Background(), pr("c", 0, "", 0, 0, false))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	s.Append(Gauge("b1", 1))
	resp, err := s.Pull(context.Background(), pr("c", 0, "", 0, 0, false))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), resp.GetLastSequence())
}

func TestMaxBytesCapsTheAnswer(t *testing.T) {
	s := New(Options{Epoch: "E"})
	s.Append(Gauge("b1", 2))
	s.Append(Gauge("b2", 2))
	one, err := s.Pull(context.Background(), pr("probe", 0, "E", 0, 1, false))
	require.NoError(t, err)
	size := uint64(len(one.GetExportMetricsServiceRequest()))
	req := pr("c", 0, "E", 0, 0, false)
	req.MaxBytes = size + 1 // room for one batch, not two
	resp, err := s.Pull(context.Background(), req)
	require.NoError(t, err)
	assert.Equal(t, []uint64{1, 1}, []uint64{resp.GetFirstSequence(), resp.GetLastSequence()})
	assert.True(t, resp.GetMore())
}
