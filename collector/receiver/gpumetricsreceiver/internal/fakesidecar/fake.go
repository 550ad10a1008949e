// Package fakesidecar is an in-memory gpumetrics.v1.MetricsPullService and LogsPullService for
// the receiver's tests and its test plugin. It follows the pull rules of the Python sidecar's
// BatchStore and servicer (docs/protocol.md, receiver/gpumetrics/store/batchstore.py,
// receiver/gpumetrics/service/pull.py), and it is held to them: the conformance cases of
// tests/testdata/conformance (pull.yaml, logs_pull.yaml) run against it in conformance_test.go,
// as they run against the real sidecar.
//
// What it models: sequences per epoch and batches stored as serialized bytes (an answer is their
// concatenation); per-consumer cursors, delivered sequences (an acknowledgement is clamped to
// them) and read positions; release once every consumer acknowledged; the store's limits
// (max_data_points, max_bytes, max_age, max_consumers) with drops charged to the consumers that
// had not acknowledged them and reported once; the answer caps (max_data_points, max_bytes, the
// first batch always whole, the server's default and largest answer); the request checks
// (consumer names, the reserved "push", a negative rejected count) with the sidecar's messages;
// UNAVAILABLE before the first batch of the metric store; and, when served with TrackDeliveries,
// a Pull whose answer gRPC could not send taken back.
//
// Not modelled: consumer expiry (consumer_ttl_s), a collection split into batches, the in-flight
// budget, tokens of two kinds. Test hooks that no sidecar has: Drop, FailRequest, OnPull and
// MaxBatchesPerPull.
package fakesidecar

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

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

// The sidecar's defaults (receiver/gpumetrics/store/limits.py, service/pull.py).
const (
	defaultConsumer         = "default"
	pushConsumer            = "push"
	defaultMaxDataPoints    = 500_000
	defaultMaxBytes         = 96 << 20
	defaultMaxAge           = 15 * time.Minute
	defaultMaxConsumers     = 16
	defaultPullMaxBytes     = 4<<20 - 64<<10
	defaultPullMaxAnswer    = 16 << 20
	forgottenAfterSeconds   = 300 // consumer_ttl_s, only quoted in the RESOURCE_EXHAUSTED message
	consumerNameMaxLength   = 128
	unavailableNotYetStored = "no collection has been stored yet; retry later"
)

var consumerName = regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,128}$`)

// Limits are the store's bounds (store.* of the sidecar's configuration; the log store's are
// events.max_*); 0 is the sidecar's default.
type Limits struct {
	MaxDataPoints uint64        // store.max_data_points (log store: events.max_log_records)
	MaxBytes      uint64        // store.max_bytes (log store: events.max_bytes)
	MaxAge        time.Duration // store.max_age_s (log store: events.max_age_s)
	MaxConsumers  int           // store.max_consumers
}

// Options configure a Server.
type Options struct {
	// Epoch is the first store epoch ("epoch-1" when empty).
	Epoch string
	// Token, when set, is required as "authorization: Bearer <Token>" on every Pull.
	Token string
	// Limits bound the store (0: the sidecar's defaults).
	Limits Limits
	// DefaultMaxBytes is the answer size of a Pull that sets no max_bytes
	// (server.pull_default_max_bytes; 0: 4 MiB - 64 KiB); MaxAnswerBytes caps any answer
	// (server.pull_max_bytes; 0: 16 MiB).
	DefaultMaxBytes, MaxAnswerBytes uint64
	// Now is the store's clock (batch ages); nil: time.Now.
	Now func() time.Time
	// MaxBatchesPerPull bounds the batches in one response (0 = no bound besides the caps): a
	// test hook, standing in for answer sizes without large batches.
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
	data   []byte // a serialized ExportMetricsServiceRequest (or ExportLogsServiceRequest)
	points uint64
	at     time.Time
}

type consumerState struct {
	acked, delivered uint64
	droppedTotal     uint64
	pendingDropped   uint64
	pendingReasons   []string // in the order they happened, each once
}

func (c *consumerState) charge(points uint64, reason string) {
	c.droppedTotal += points
	c.pendingDropped += points
	c.note(reason)
}

func (c *consumerState) note(reason string) {
	if !slices.Contains(c.pendingReasons, reason) {
		c.pendingReasons = append(c.pendingReasons, reason)
	}
}

// signalNames is what differs between the metric store and the log store in the sidecar's
// answers: the previous_outcome field that counts rejections, and the name of the point limit.
type signalNames struct {
	rejectedField string
	pointsReason  string
}

var (
	metricsNames = signalNames{rejectedField: "rejected_data_points", pointsReason: "max_data_points"}
	logsNames    = signalNames{rejectedField: "rejected_log_records", pointsReason: "max_log_records"}
)

// Server is the fake MetricsPullService. Safe for concurrent use.
type Server struct {
	gpumetricsv1.UnimplementedMetricsPullServiceServer

	opts   Options
	limits Limits
	names  signalNames

	mu        sync.Mutex
	epoch     string
	last      uint64 // sequence of the newest batch appended in epoch
	batches   []batch
	consumers map[string]*consumerState
	ackedHW   uint64 // highest sequence any consumer acknowledged (releases when none is left)
	drops     []drop // injected by Drop
	requests  []*gpumetricsv1.PullRequest
	failures  map[int]error
}

type drop struct {
	points uint64
	reason string
}

// New returns a Server with no batches.
func New(opts Options) *Server { return newServer(opts, metricsNames) }

func newServer(opts Options, names signalNames) *Server {
	if opts.Epoch == "" {
		opts.Epoch = "epoch-1"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.DefaultMaxBytes == 0 {
		opts.DefaultMaxBytes = defaultPullMaxBytes
	}
	if opts.MaxAnswerBytes == 0 {
		opts.MaxAnswerBytes = max(defaultPullMaxAnswer, opts.DefaultMaxBytes)
	}
	l := opts.Limits
	l.MaxDataPoints = cmpOr(l.MaxDataPoints, defaultMaxDataPoints)
	l.MaxBytes = cmpOr(l.MaxBytes, defaultMaxBytes)
	l.MaxAge = cmpOr(l.MaxAge, defaultMaxAge)
	l.MaxConsumers = cmpOr(l.MaxConsumers, defaultMaxConsumers)
	return &Server{opts: opts, limits: l, names: names, epoch: opts.Epoch, consumers: map[string]*consumerState{}}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Append stores md as the next batch and returns its sequence. It panics if md cannot be
// serialized (test data only).
func (s *Server) Append(md pmetric.Metrics) uint64 {
	data, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		panic(fmt.Sprintf("fakesidecar: marshal: %v", err))
	}
	return s.AppendSerialized(data, uint64(md.DataPointCount())) //nolint:gosec // never negative
}

// AppendSerialized stores data, a serialized export request holding points items, as the next
// batch and returns its sequence; the store's limits apply at once, as in the sidecar.
func (s *Server) AppendSerialized(data []byte, points uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last++
	s.batches = append(s.batches, batch{seq: s.last, data: data, points: points, at: s.opts.Now()})
	s.enforceLimits()
	return s.last
}

// Drop makes the next Pull (of any consumer) announce points dropped for reason, whatever the
// limits: a test hook.
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
	s.epoch, s.last, s.batches, s.ackedHW, s.drops = epoch, 0, nil, 0, nil
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

// Held returns the number of batches held (appended, not yet released or dropped).
func (s *Server) Held() int { return len(s.HeldSequences()) }

// HeldSequences returns the sequences of the batches held, oldest first.
func (s *Server) HeldSequences() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint64, len(s.batches))
	for i, b := range s.batches {
		out[i] = b.seq
	}
	return out
}

// Pull implements gpumetrics.v1.MetricsPullService/Pull.
func (s *Server) Pull(ctx context.Context, req *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error) {
	return s.pull(ctx, req, req.GetPreviousOutcome().GetRejectedDataPoints())
}

// pull is one Pull of either signal; req carries the request in PullRequest's terms and
// rejected the previous_outcome's rejected count. It follows gpumetrics.service.pull.StorePull
// (checks, then the store) and BatchStore.pull (limits, registration, acknowledgement, answer).
func (s *Server) pull(ctx context.Context, req *gpumetricsv1.PullRequest, rejected int64) (*gpumetricsv1.PullResponse, error) {
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
	name, err := s.check(req, rejected)
	if err != nil {
		return nil, err
	}
	want := min(cmpOr(req.GetMaxBytes(), s.opts.DefaultMaxBytes), s.opts.MaxAnswerBytes)
	s.enforceLimits()
	c := s.consumers[name]
	if c == nil {
		if c, err = s.register(name); err != nil {
			return nil, err
		}
	}
	current := req.GetAckEpoch() == s.epoch
	if current && req.GetAckSequence() > c.acked {
		s.ack(c, min(req.GetAckSequence(), c.delivered))
		s.release()
	}
	position := c.acked
	if current {
		position = max(position, req.GetReadAfterSequence())
	}
	resp := &gpumetricsv1.PullResponse{Epoch: s.epoch}
	for _, d := range s.drops {
		c.charge(d.points, d.reason)
	}
	s.drops = nil
	resp.DroppedDataPoints, resp.DropReasons = c.pendingDropped, c.pendingReasons
	c.pendingDropped, c.pendingReasons = 0, nil
	resp.DroppedDataPointsTotal = c.droppedTotal
	before := c.delivered
	if !req.GetAckOnly() {
		s.answer(req, position, want, resp)
		if resp.LastSequence != 0 && resp.FirstSequence <= c.delivered+1 { // contiguous with what it was sent
			c.delivered = max(c.delivered, resp.LastSequence)
		}
	}
	tail := max(resp.LastSequence, position)
	resp.More = len(s.batches) > 0 && s.batches[len(s.batches)-1].seq > tail
	if c.delivered != before || resp.DroppedDataPoints > 0 || len(resp.DropReasons) > 0 {
		d := delivery{epoch: s.epoch, consumer: name, before: before, after: c.delivered,
			dropped: resp.DroppedDataPoints, reasons: slices.Clone(resp.DropReasons)}
		onFailedDelivery(ctx, func() { s.undo(d) })
	}
	return resp, nil
}

// check validates req as gpumetrics.service.pull.StorePull does, with its messages; it returns
// the consumer name ("" is "default").
func (s *Server) check(req *gpumetricsv1.PullRequest, rejected int64) (string, error) {
	name := req.GetConsumer()
	if name == "" {
		name = defaultConsumer
	}
	if !consumerName.MatchString(name) {
		shown := name
		if len([]rune(shown)) > 40 {
			shown = string([]rune(shown)[:40]) + "…"
		}
		return "", status.Errorf(codes.InvalidArgument, "consumer: must be 1 to %d characters of [A-Za-z0-9._:/-], got '%s'", consumerNameMaxLength, shown)
	}
	if name == pushConsumer {
		return "", status.Errorf(codes.InvalidArgument, "consumer: '%s' is reserved for the sidecar's own exporter", name)
	}
	if rejected < 0 {
		return "", status.Errorf(codes.InvalidArgument, "previous_outcome.%s: must be >= 0, got %d", s.names.rejectedField, rejected)
	}
	if s.last == 0 && !s.opts.EmptyAnswered {
		return "", status.Error(codes.Unavailable, unavailableNotYetStored)
	}
	return name, nil
}

// register adds consumer name with its cursor just before the oldest batch held.
func (s *Server) register(name string) (*consumerState, error) {
	if len(s.consumers) >= s.limits.MaxConsumers {
		return nil, status.Errorf(codes.ResourceExhausted,
			"consumer: '%s' would be consumer number %d; at most %d (store.max_consumers) are kept, and idle ones are forgotten after %d s",
			name, len(s.consumers)+1, s.limits.MaxConsumers, forgottenAfterSeconds)
	}
	base := s.last
	if len(s.batches) > 0 {
		base = s.batches[0].seq - 1
	}
	c := &consumerState{acked: base, delivered: base}
	s.consumers[name] = c
	return c, nil
}

func (s *Server) ack(c *consumerState, upto uint64) {
	if upto > c.acked {
		c.acked = upto
		s.ackedHW = max(s.ackedHW, upto)
	}
}

// release forgets the batches every consumer acknowledged (with none registered: what one did).
func (s *Server) release() {
	floor := s.ackedHW
	if len(s.consumers) > 0 {
		floor = s.last
		for _, c := range s.consumers {
			floor = min(floor, c.acked)
		}
	}
	for len(s.batches) > 0 && s.batches[0].seq <= floor {
		s.batches = s.batches[1:]
	}
}

// enforceLimits drops the oldest batches while a limit is exceeded: age first, then points, then
// bytes, as BatchStore._enforce_limits.
func (s *Server) enforceLimits() {
	now := s.opts.Now()
	for len(s.batches) > 0 && now.Sub(s.batches[0].at) > s.limits.MaxAge {
		s.dropOldest("max_age")
	}
	for len(s.batches) > 0 && s.heldPoints() > s.limits.MaxDataPoints {
		s.dropOldest(s.names.pointsReason)
	}
	for len(s.batches) > 0 && s.heldBytes() > s.limits.MaxBytes {
		s.dropOldest("max_bytes")
	}
}

// dropOldest drops the oldest batch and charges it to every consumer that had not acknowledged
// it, whose cursor then moves past it.
func (s *Server) dropOldest(reason string) {
	b := s.batches[0]
	s.batches = s.batches[1:]
	for _, c := range s.consumers {
		if c.acked < b.seq {
			c.charge(b.points, reason)
			c.acked = b.seq
			c.delivered = max(c.delivered, b.seq)
		}
	}
}

func (s *Server) heldPoints() (n uint64) {
	for _, b := range s.batches {
		n += b.points
	}
	return n
}

func (s *Server) heldBytes() (n uint64) {
	for _, b := range s.batches {
		n += uint64(len(b.data))
	}
	return n
}

// answer fills resp with the batches after position that fit the request's caps (the first
// always).
func (s *Server) answer(req *gpumetricsv1.PullRequest, position, maxBytes uint64, resp *gpumetricsv1.PullResponse) {
	var size uint64
	for _, b := range s.batches {
		if b.seq <= position {
			continue
		}
		if resp.LastSequence != 0 {
			full := s.opts.MaxBatchesPerPull > 0 && resp.LastSequence-resp.FirstSequence+1 >= uint64(s.opts.MaxBatchesPerPull)
			full = full || (req.GetMaxDataPoints() > 0 && resp.DataPoints+b.points > uint64(req.GetMaxDataPoints()))
			full = full || size+uint64(len(b.data)) > maxBytes
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

// delivery is what one Pull changed in its consumer's record, to take back if its answer was
// never sent (BatchStore.undo_pull).
type delivery struct {
	epoch, consumer string
	before, after   uint64
	dropped         uint64
	reasons         []string
}

func (s *Server) undo(d delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.consumers[d.consumer]
	if d.epoch != s.epoch || c == nil {
		return
	}
	if c.delivered == d.after {
		c.delivered = max(d.before, c.acked)
	}
	c.pendingDropped += d.dropped
	for _, r := range d.reasons {
		c.note(r)
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

// NewLogs returns a LogsServer whose store answers empty before its first batch and names its
// record limit max_log_records, as the sidecar's log store.
func NewLogs(opts Options) *LogsServer {
	opts.EmptyAnswered = true
	return &LogsServer{Store: newServer(opts, logsNames)}
}

// AppendLogs stores ld as the next log batch and returns its sequence. It panics if ld cannot be
// serialized (test data only).
func (l *LogsServer) AppendLogs(ld plog.Logs) uint64 {
	data, err := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	if err != nil {
		panic(fmt.Sprintf("fakesidecar: marshal: %v", err))
	}
	return l.Store.AppendSerialized(data, uint64(ld.LogRecordCount())) //nolint:gosec // never negative
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
	resp, err := l.Store.pull(ctx, pull, req.GetPreviousOutcome().GetRejectedLogRecords())
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
