package fakesidecar

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// The pull rules are the conformance cases' (conformance_test.go); these tests cover the hooks
// the fake adds for the receiver's tests, which no sidecar has.

func pull(t *testing.T, s *Server, req *gpumetricsv1.PullRequest) *gpumetricsv1.PullResponse {
	t.Helper()
	resp, err := s.Pull(context.Background(), req)
	require.NoError(t, err)
	return resp
}

func TestMaxBatchesPerPullBoundsAnAnswer(t *testing.T) {
	s := New(Options{MaxBatchesPerPull: 2})
	for range 3 {
		s.Append(Gauge("b", 1))
	}
	r := pull(t, s, &gpumetricsv1.PullRequest{Consumer: "c"})
	assert.Equal(t, []uint64{1, 2}, []uint64{r.GetFirstSequence(), r.GetLastSequence()})
	assert.True(t, r.GetMore())
}

func TestDropIsReportedOnceToTheNextPull(t *testing.T) {
	s := New(Options{})
	s.Append(Gauge("b1", 1))
	s.Drop(7, "max_bytes")
	r := pull(t, s, &gpumetricsv1.PullRequest{Consumer: "c"})
	assert.Equal(t, uint64(7), r.GetDroppedDataPoints())
	assert.Equal(t, uint64(7), r.GetDroppedDataPointsTotal())
	assert.Equal(t, []string{"max_bytes"}, r.GetDropReasons())
	r = pull(t, s, &gpumetricsv1.PullRequest{Consumer: "c"})
	assert.Zero(t, r.GetDroppedDataPoints())
	assert.Equal(t, uint64(7), r.GetDroppedDataPointsTotal())
}

func TestFailRequestFailsThatPullAndChangesNothing(t *testing.T) {
	s := New(Options{})
	s.Append(Gauge("b1", 1))
	s.FailRequest(1, status.Error(codes.Unavailable, "restarting"))
	_, err := s.Pull(context.Background(), &gpumetricsv1.PullRequest{Consumer: "c"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	r := pull(t, s, &gpumetricsv1.PullRequest{Consumer: "c"})
	assert.Equal(t, uint64(1), r.GetLastSequence())
	assert.Len(t, s.Requests(), 2)
}

func TestTokenIsRequired(t *testing.T) {
	s := New(Options{Token: "s3cret"})
	s.Append(Gauge("b1", 1))
	_, err := s.Pull(context.Background(), &gpumetricsv1.PullRequest{})
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer s3cret"))
	r, err := s.Pull(ctx, &gpumetricsv1.PullRequest{})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), r.GetLastSequence())
	assert.Empty(t, s.Requests()[0].GetConsumer(), "recorded as sent")
	assert.Equal(t, uint64(0), s.Acked("default"))
}
