// Package fakesidecar is an in-memory gpumetrics.v1.MetricsPullService for the receiver's tests
// and its test plugin. It is not a model of the Python sidecar's store; it implements the pull
// contract of proto/gpumetrics/v1/pull.proto as the receiver expects it:
//
//   - batches are numbered from 1 within an epoch; each consumer has a delivered cursor and an
//     acknowledged cursor;
//   - a Pull first applies ack_sequence when ack_epoch is the current epoch; it then rewinds the
//     delivered cursor to the acknowledged one when the ack_epoch is not current (a new consumer,
//     or one that saw an older epoch) or when previous_outcome reports rejected data points (the
//     consumer's pipeline refused them: re-deliver);
//   - the response carries up to MaxBatchesPerPull batches after the delivered cursor, at least
//     one, and `more` when others wait;
//   - with ReplayFromAck, the delivered cursor is always rewound to the acknowledged one, which
//     is the other reading of the contract ("the cursor is the acknowledgement").
package fakesidecar

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// Options configure a Server.
type Options struct {
	// Epoch is the first store epoch ("epoch-1" when empty).
	Epoch string
	// Token, when set, is required as "authorization: Bearer <Token>" on every Pull.
	Token string
	// MaxBatchesPerPull bounds the batches in one response (1 when 0).
	MaxBatchesPerPull int
	// ReplayFromAck serves every Pull from the acknowledged cursor.
	ReplayFromAck bool
	// OnPull, when set, is called at the start of every Pull (before authorization) with the
	// call's context; a test can block there to hold a Pull in flight.
	OnPull func(ctx context.Context)
}

type batch struct {
	seq uint64
	md  pmetric.Metrics
}

type consumerState struct {
	acked, delivered uint64
}

// Server is the fake MetricsPullService. Safe for concurrent use.
type Server struct {
	gpumetricsv1.UnimplementedMetricsPullServiceServer

	opts Options

	mu        sync.Mutex
	epoch     string
	next      uint64
	batches   []batch
	consumers map[string]*consumerState
	drops     []drop
	requests  []*gpumetricsv1.PullRequest
	failures  map[int]error
}

type drop struct {
	points uint64
	reason string
}

// New returns a Server with no batches.
func New(opts Options) *Server {
	if opts.Epoch == "" {
		opts.Epoch = "epoch-1"
	}
	if opts.MaxBatchesPerPull <= 0 {
		opts.MaxBatchesPerPull = 1
	}
	return &Server{opts: opts, epoch: opts.Epoch, next: 1, consumers: map[string]*consumerState{}}
}

// Append stores md as the next batch and returns its sequence.
func (s *Server) Append(md pmetric.Metrics) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := pmetric.NewMetrics()
	md.CopyTo(cp)
	seq := s.next
	s.next++
	s.batches = append(s.batches, batch{seq: seq, md: cp})
	return seq
}

// Drop makes the next Pull announce points dropped for reason.
func (s *Server) Drop(points uint64, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drops = append(s.drops, drop{points: points, reason: reason})
}

// FailRequest makes the n-th Pull (1-based, counting every Pull this Server received) fail with
// err, a gRPC status error, changing nothing.
func (s *Server) FailRequest(n int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures == nil {
		s.failures = map[int]error{}
	}
	s.failures[n] = err
}

// Restart forgets every batch and cursor and starts epoch, as a restarted sidecar would.
func (s *Server) Restart(epoch string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch, s.next, s.batches = epoch, 1, nil
	s.consumers = map[string]*consumerState{}
}

// Requests returns copies of every PullRequest received, in order.
func (s *Server) Requests() []*gpumetricsv1.PullRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*gpumetricsv1.PullRequest, len(s.requests))
	for i, r := range s.requests {
		out[i] = proto.CloneOf(r)
	}
	return out
}

// Acked returns consumer's acknowledged sequence in the current epoch.
func (s *Server) Acked(consumer string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.consumers[consumer]; ok {
		return c.acked
	}
	return 0
}

// Pull implements gpumetrics.v1.MetricsPullService/Pull.
func (s *Server) Pull(ctx context.Context, req *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error) {
	if s.opts.OnPull != nil {
		s.opts.OnPull(ctx)
	}
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, proto.CloneOf(req))
	if err, ok := s.failures[len(s.requests)]; ok {
		return nil, err
	}
	c := s.consumers[req.GetConsumer()]
	if c == nil {
		c = &consumerState{}
		s.consumers[req.GetConsumer()] = c
	}
	current := req.GetAckEpoch() == s.epoch
	if current && req.GetAckSequence() > c.acked {
		c.acked = min(req.GetAckSequence(), c.delivered)
	}
	if !current || req.GetPreviousOutcome().GetRejectedDataPoints() > 0 || s.opts.ReplayFromAck {
		c.delivered = c.acked
	}
	resp := &gpumetricsv1.PullResponse{Epoch: s.epoch}
	for _, d := range s.drops {
		resp.DroppedDataPoints += d.points
		resp.DropReasons = append(resp.DropReasons, d.reason)
	}
	resp.DroppedDataPointsTotal = resp.DroppedDataPoints
	s.drops = nil
	if req.GetAckOnly() {
		return resp, nil
	}
	merged := pmetric.NewMetrics()
	for _, b := range s.batches {
		if b.seq <= c.delivered {
			continue
		}
		if resp.LastSequence != 0 && int(resp.LastSequence-resp.FirstSequence)+1 >= s.opts.MaxBatchesPerPull {
			resp.More = true
			break
		}
		if resp.FirstSequence == 0 {
			resp.FirstSequence = b.seq
		}
		resp.LastSequence = b.seq
		cp := pmetric.NewMetrics()
		b.md.CopyTo(cp)
		cp.ResourceMetrics().MoveAndAppendTo(merged.ResourceMetrics())
	}
	if resp.LastSequence == 0 {
		return resp, nil
	}
	c.delivered = resp.LastSequence
	resp.DataPoints = uint64(merged.DataPointCount()) //nolint:gosec // never negative
	b, err := pmetricotlp.NewExportRequestFromMetrics(merged).MarshalProto()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "marshal: %v", err)
	}
	resp.ExportMetricsServiceRequest = b
	return resp, nil
}

func (s *Server) authorize(ctx context.Context) error {
	if s.opts.Token == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if v == "Bearer "+s.opts.Token {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "missing or wrong bearer token")
}

// Gauge returns a pmetric.Metrics with one resource (attribute "batch" = label), one gauge
// "test.value" and n data points valued 0..n-1.
func Gauge(label string, n int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("batch", label)
	m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("test.value")
	g := m.SetEmptyGauge()
	for i := range n {
		dp := g.DataPoints().AppendEmpty()
		dp.SetIntValue(int64(i))
		dp.Attributes().PutStr("point", fmt.Sprint(i))
	}
	return md
}
