// Package fakesidecar is an in-memory gpumetrics.v1.MetricsPullService for the receiver's tests
// and its test plugin. It follows the pull rules of the Python sidecar's BatchStore and servicer
// (docs/protocol.md, receiver/gpumetrics/store/batchstore.py):
//
//   - batches are numbered from 1 within an epoch and stored serialized, as
//     ExportMetricsServiceRequest bytes; an answer is their byte-wise concatenation;
//   - each consumer ("" is "default") has an acknowledged cursor and a delivered sequence, the end
//     of the unbroken run of batches sent to it from its cursor on (an answer that skips ahead
//     with read_after_sequence does not extend it); it is registered by its first Pull with its
//     cursor just before the oldest batch held;
//   - a Pull first applies ack_sequence when ack_epoch is the current epoch (never backwards,
//     clamped to the delivered sequence), releases the batches every consumer acknowledged,
//     then answers with the batches after the read position max(read_after_sequence, cursor)
//     (read_after_sequence is ignored when ack_epoch is not the current epoch), oldest first, as
//     many as fit max_data_points, max_bytes and Options.MaxBatchesPerPull (the first always);
//     `more` says batches wait after the last one sent (after the read position when none was);
//     ack_only answers no data;
//   - a Pull before the first batch of an epoch fails with UNAVAILABLE (unless
//     Options.EmptyAnswered: the log store answers empty, as the sidecar's does).
//
// LogsServer serves one such store as gpumetrics.v1.LogsPullService: PullLogsRequest and
// PullLogsResponse are the same steps with log records for data points.
//
// Not modelled: the store's limits and consumer expiry. Drop injects a drop report instead.
package fakesidecar

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// defaultConsumer is the consumer name of a Pull that names none (as in the Python store).
const defaultConsumer = "default"

// Options configure a Server.
type Options struct {
	// Epoch is the first store epoch ("epoch-1" when empty).
	Epoch string
	// Token, when set, is required as "authorization: Bearer <Token>" on every Pull.
	Token string
	// MaxBatchesPerPull bounds the batches in one response (0 = no bound besides the request's
	// max_data_points and max_bytes), standing in for the sidecar's default answer size.
	MaxBatchesPerPull int
	// OnPull, when set, is called at the start of every Pull (before authorization) with the
	// call's context; a test can block there to hold a Pull in flight.
	OnPull func(ctx context.Context)
	// EmptyAnswered makes a Pull before the first batch answer empty instead of UNAVAILABLE
	// (the sidecar's log store: a node may have no event for days).
	EmptyAnswered bool
}

type batch struct {
	seq    uint64
	data   []byte // a serialized ExportMetricsServiceRequest
	points uint64
}

type consumerState struct {
	acked, sent  uint64
	droppedTotal uint64
}

// Server is the fake MetricsPullService. Safe for concurrent use.
type Server struct {
	gpumetricsv1.UnimplementedMetricsPullServiceServer

	opts Options

	mu        sync.Mutex
	epoch     string
	last      uint64 // sequence of the newest batch appended in epoch
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
	return &Server{opts: opts, epoch: opts.Epoch, consumers: map[string]*consumerState{}}
}

// Append stores md as the next batch and returns its sequence. It panics if md cannot be
// serialized (test data only).
func (s *Server) Append(md pmetric.Metrics) uint64 {
	data, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		panic(fmt.Sprintf("fakesidecar: marshal: %v", err))
	}
	return s.appendRaw(data, uint64(md.DataPointCount())) //nolint:gosec // never negative
}

func (s *Server) appendRaw(data []byte, items uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last++
	s.batches = append(s.batches, batch{seq: s.last, data: data, points: items})
	return s.last
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
	s.epoch, s.last, s.batches = epoch, 0, nil
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

// Held returns the number of batches held (appended, not yet released).
func (s *Server) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.batches)
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
	if s.last == 0 && !s.opts.EmptyAnswered {
		return nil, status.Error(codes.Unavailable, "no collection has been stored yet; retry later")
	}
	c := s.consumer(req.GetConsumer())
	current := req.GetAckEpoch() == s.epoch
	if current && req.GetAckSequence() > c.acked {
		c.acked = max(c.acked, min(req.GetAckSequence(), c.sent))
		s.release()
	}
	position := c.acked
	if current {
		position = max(position, req.GetReadAfterSequence())
	}
	resp := &gpumetricsv1.PullResponse{Epoch: s.epoch}
	for _, d := range s.drops {
		resp.DroppedDataPoints += d.points
		resp.DropReasons = append(resp.DropReasons, d.reason)
	}
	s.drops = nil
	c.droppedTotal += resp.DroppedDataPoints
	resp.DroppedDataPointsTotal = c.droppedTotal
	if !req.GetAckOnly() {
		s.answer(req, position, resp)
		if resp.LastSequence != 0 && resp.FirstSequence <= c.sent+1 { // contiguous with what it was sent
			c.sent = max(c.sent, resp.LastSequence)
		}
	}
	tail := max(resp.LastSequence, position)
	resp.More = len(s.batches) > 0 && s.batches[len(s.batches)-1].seq > tail
	return resp, nil
}

// consumer returns name's state, registering it just before the oldest batch held.
func (s *Server) consumer(name string) *consumerState {
	if name == "" {
		name = defaultConsumer
	}
	c := s.consumers[name]
	if c == nil {
		base := s.last
		if len(s.batches) > 0 {
			base = s.batches[0].seq - 1
		}
		c = &consumerState{acked: base, sent: base}
		s.consumers[name] = c
	}
	return c
}

// release forgets the batches every consumer acknowledged.
func (s *Server) release() {
	floor := s.last
	for _, c := range s.consumers {
		floor = min(floor, c.acked)
	}
	for len(s.batches) > 0 && s.batches[0].seq <= floor {
		s.batches = s.batches[1:]
	}
}

// answer fills resp with the batches after position that fit the request's caps.
func (s *Server) answer(req *gpumetricsv1.PullRequest, position uint64, resp *gpumetricsv1.PullResponse) {
	var size uint64
	for _, b := range s.batches {
		if b.seq <= position {
			continue
		}
		if resp.LastSequence != 0 {
			full := s.opts.MaxBatchesPerPull > 0 && resp.LastSequence-resp.FirstSequence+1 >= uint64(s.opts.MaxBatchesPerPull)
			full = full || (req.GetMaxDataPoints() > 0 && resp.DataPoints+b.points > uint64(req.GetMaxDataPoints()))
			full = full || (req.GetMaxBytes() > 0 && size+uint64(len(b.data)) > req.GetMaxBytes())
			if full {
				break
			}
		}
		if resp.FirstSequence == 0 {
			resp.FirstSequence = b.seq
		}
		resp.LastSequence = b.seq
		resp.DataPoints += b.points
		size += uint64(len(b.data))
		resp.ExportMetricsServiceRequest = append(resp.ExportMetricsServiceRequest, b.data...)
	}
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

// LogsServer is the fake LogsPullService over its own Server (the log store): PullLogs is the
// store's Pull with the logs message types. Safe for concurrent use.
type LogsServer struct {
	gpumetricsv1.UnimplementedLogsPullServiceServer
	// Store holds the log batches; its Requests, Acked, Held, Drop, FailRequest and Restart
	// work as for metrics (requests are recorded as PullRequests).
	Store *Server
}

// NewLogs returns a LogsServer whose store answers empty before its first batch.
func NewLogs(opts Options) *LogsServer {
	opts.EmptyAnswered = true
	return &LogsServer{Store: New(opts)}
}

// AppendLogs stores ld as the next log batch and returns its sequence. It panics if ld cannot be
// serialized (test data only).
func (l *LogsServer) AppendLogs(ld plog.Logs) uint64 {
	data, err := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	if err != nil {
		panic(fmt.Sprintf("fakesidecar: marshal: %v", err))
	}
	return l.Store.appendRaw(data, uint64(ld.LogRecordCount())) //nolint:gosec // never negative
}

// PullLogs implements gpumetrics.v1.LogsPullService/PullLogs.
func (l *LogsServer) PullLogs(ctx context.Context, req *gpumetricsv1.PullLogsRequest) (*gpumetricsv1.PullLogsResponse, error) {
	pull := &gpumetricsv1.PullRequest{
		Consumer:          req.GetConsumer(),
		AckSequence:       req.GetAckSequence(),
		AckEpoch:          req.GetAckEpoch(),
		MaxDataPoints:     req.GetMaxLogRecords(),
		MaxBytes:          req.GetMaxBytes(),
		AckOnly:           req.GetAckOnly(),
		ReadAfterSequence: req.GetReadAfterSequence(),
	}
	if o := req.GetPreviousOutcome(); o != nil {
		pull.PreviousOutcome = &gpumetricsv1.PreviousOutcome{
			LastSequence:       o.GetLastSequence(),
			RejectedDataPoints: o.GetRejectedLogRecords(),
			ErrorMessage:       o.GetErrorMessage(),
		}
	}
	resp, err := l.Store.Pull(ctx, pull)
	if err != nil {
		return nil, err
	}
	return &gpumetricsv1.PullLogsResponse{
		ExportLogsServiceRequest: resp.GetExportMetricsServiceRequest(),
		Epoch:                    resp.GetEpoch(),
		FirstSequence:            resp.GetFirstSequence(),
		LastSequence:             resp.GetLastSequence(),
		More:                     resp.GetMore(),
		LogRecords:               resp.GetDataPoints(),
		DroppedLogRecords:        resp.GetDroppedDataPoints(),
		DroppedLogRecordsTotal:   resp.GetDroppedDataPointsTotal(),
		DropReasons:              resp.GetDropReasons(),
	}, nil
}

// Event returns a plog.Logs with one resource (attribute "batch" = label) and n log records
// named "nvidia.gpu.xid", with attribute "record" = 0..n-1.
func Event(label string, n int) plog.Logs {
	ld := plog.NewLogs()
	rl := ld.ResourceLogs().AppendEmpty()
	rl.Resource().Attributes().PutStr("batch", label)
	sl := rl.ScopeLogs().AppendEmpty()
	for i := range n {
		r := sl.LogRecords().AppendEmpty()
		r.SetEventName("nvidia.gpu.xid")
		r.Body().SetStr(fmt.Sprintf("event %d of %s", i, label))
		r.Attributes().PutInt("record", int64(i))
	}
	return ld
}
