// Package declaretest is a recording gpumetrics.v1.ProfilerIntegrationService for tests of the
// declaring clients (pkg/declarer, the gpumetrics exporter). It holds no identity state and
// applies no rule of the sidecar's store: it records every event each StreamDeclarations stream
// carries, with the stream's metadata, and answers each one in order as the protocol requires
// (docs/protocol.md), accepted unless a test's Reject hook says otherwise. What the sidecar makes
// of the events is tested against the real sidecar (the exporter's integration tests).
package declaretest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// WaitTimeout bounds every wait of this package: generous, so a loaded machine never fails a
// test, and finite, so a broken client does not hang it.
const WaitTimeout = 30 * time.Second

// Event is one message received on a stream; a DeclareBatch is recorded as one declare Event
// per declaration it carries, in order, so tests see the processes declared however they came.
type Event struct {
	// Stream numbers the streams in the order they were opened, from 1.
	Stream int
	// Request is the message as received (a declare of a batch: that declaration alone).
	Request *gpumetricsv1.StreamDeclarationsRequest
	// Batch numbers, from 1 per stream, the DeclareBatch a declare came in (0: its own event).
	Batch int
}

// Kind returns "declare", "exit", "resync_begin", "resync_end" or "" (no event set).
func (e Event) Kind() string {
	switch e.Request.GetEvent().(type) {
	case *gpumetricsv1.StreamDeclarationsRequest_Declare:
		return "declare"
	case *gpumetricsv1.StreamDeclarationsRequest_Exit:
		return "exit"
	case *gpumetricsv1.StreamDeclarationsRequest_ResyncBegin:
		return "resync_begin"
	case *gpumetricsv1.StreamDeclarationsRequest_ResyncEnd:
		return "resync_end"
	}
	return ""
}

// Server records StreamDeclarations events. The zero value is not usable; call New.
type Server struct {
	gpumetricsv1.UnimplementedProfilerIntegrationServiceServer

	// Reject, when set, decides the answer to each event: a non-nil Rejection rejects it.
	Reject func(*gpumetricsv1.StreamDeclarationsRequest) *gpumetricsv1.Rejection
	// BeforeAnswer, when set, runs before each answer (a test blocks in it to stand for a
	// sidecar that does not answer); ctx ends with the stream.
	BeforeAnswer func(ctx context.Context)
	// Discard keeps no event (benchmarks that measure the client's memory): Events and
	// WaitFor then see none.
	Discard bool
	// NoBatch answers a DeclareBatch as a sidecar that predates it does: rejected, field "event"
	// (no event set), nothing applied; such a batch is recorded as no event.
	NoBatch bool

	mu       sync.Mutex
	events   []Event
	metadata []metadata.MD // per stream
	changed  chan struct{} // closed and replaced on every new event or stream
}

// HoldAnswers makes the server take events without answering them (a hung sidecar) until the
// returned release is called or the stream ends. Call it before the server serves.
func (s *Server) HoldAnswers() (release func()) {
	held := make(chan struct{})
	s.BeforeAnswer = func(ctx context.Context) {
		select {
		case <-held:
		case <-ctx.Done():
		}
	}
	var once sync.Once
	return func() { once.Do(func() { close(held) }) }
}

// New returns an empty recording server.
func New() *Server { return &Server{changed: make(chan struct{})} }

// StreamDeclarations records and answers every event of one stream.
func (s *Server) StreamDeclarations(stream grpc.BidiStreamingServer[gpumetricsv1.StreamDeclarationsRequest, gpumetricsv1.StreamDeclarationsResponse]) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	s.mu.Lock()
	s.metadata = append(s.metadata, md)
	n := len(s.metadata)
	s.notifyLocked()
	s.mu.Unlock()
	batches := 0
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil // the client ended the stream (or it broke): nothing to answer
		}
		batch := req.GetDeclareBatch()
		if batch != nil && !s.NoBatch {
			batches++
		}
		if !s.Discard {
			s.mu.Lock()
			switch {
			case batch == nil:
				s.events = append(s.events, Event{Stream: n, Request: req})
			case !s.NoBatch:
				for _, d := range batch.GetProcesses() {
					one := &gpumetricsv1.StreamDeclarationsRequest{Event: &gpumetricsv1.StreamDeclarationsRequest_Declare{Declare: d}}
					s.events = append(s.events, Event{Stream: n, Request: one, Batch: batches})
				}
			}
			s.notifyLocked()
			s.mu.Unlock()
		}
		if s.BeforeAnswer != nil {
			s.BeforeAnswer(stream.Context())
		}
		if err := stream.Send(s.answer(req)); err != nil {
			return err
		}
	}
}

// answer is the answer to req: accepted unless Reject says otherwise; for a DeclareBatch, Reject
// decides each declaration as a declare event of its own.
func (s *Server) answer(req *gpumetricsv1.StreamDeclarationsRequest) *gpumetricsv1.StreamDeclarationsResponse {
	batch := req.GetDeclareBatch()
	if batch != nil && s.NoBatch {
		return &gpumetricsv1.StreamDeclarationsResponse{Rejection: &gpumetricsv1.Rejection{
			Field: "event", Reason: "no event set (declare, exit, resync_*)",
		}}
	}
	if batch == nil {
		if s.Reject != nil {
			if r := s.Reject(req); r != nil {
				return &gpumetricsv1.StreamDeclarationsResponse{Rejection: r}
			}
		}
		return &gpumetricsv1.StreamDeclarationsResponse{Accepted: true}
	}
	resp := &gpumetricsv1.StreamDeclarationsResponse{}
	for i, d := range batch.GetProcesses() {
		if s.Reject != nil {
			one := &gpumetricsv1.StreamDeclarationsRequest{Event: &gpumetricsv1.StreamDeclarationsRequest_Declare{Declare: d}}
			if r := s.Reject(one); r != nil {
				r.Index = uint32(i)
				resp.Rejections = append(resp.Rejections, r)
				continue
			}
		}
		resp.Declared++
	}
	resp.Accepted = len(resp.Rejections) == 0
	return resp
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Events returns every event received so far, in order.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// StreamMetadata returns the incoming metadata of every stream opened so far, in order.
func (s *Server) StreamMetadata() []metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]metadata.MD(nil), s.metadata...)
}

// WaitFor waits until cond holds for the events received so far (re-checked on every new event
// or stream) and returns them; it fails the test after WaitTimeout, naming what.
func (s *Server) WaitFor(t testing.TB, what string, cond func([]Event) bool) []Event {
	t.Helper()
	deadline := time.After(WaitTimeout)
	for {
		s.mu.Lock()
		events := append([]Event(nil), s.events...)
		changed := s.changed
		s.mu.Unlock()
		if cond(events) {
			return events
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("declaretest: timed out after %s waiting for %s; events: %v", WaitTimeout, what, Describe(events))
			return nil
		}
	}
}

// LastDeclare returns the last declaration of pid among events (nil: none).
func LastDeclare(events []Event, pid uint32) *gpumetricsv1.ProcessDeclaration {
	var d *gpumetricsv1.ProcessDeclaration
	for _, e := range events {
		if e.Kind() == "declare" && e.Request.GetDeclare().GetPid() == pid {
			d = e.Request.GetDeclare()
		}
	}
	return d
}

// OnStream returns the events of stream n, described (see Describe).
func OnStream(events []Event, n int) []string {
	var out []string
	for _, e := range events {
		if e.Stream == n {
			out = append(out, describe(e))
		}
	}
	return out
}

// Describe renders events compactly for failure messages, e.g. "1:resync_begin 1:declare(42)".
func Describe(events []Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = describe(e)
	}
	return out
}

func describe(e Event) string {
	switch e.Kind() {
	case "declare":
		return fmt.Sprintf("%d:declare(%d)", e.Stream, e.Request.GetDeclare().GetPid())
	case "exit":
		return fmt.Sprintf("%d:exit(%d)", e.Stream, e.Request.GetExit().GetPid())
	}
	return fmt.Sprintf("%d:%s", e.Stream, e.Kind())
}

// Listener is a gRPC server for a Server on a unix socket that can be stopped and started again
// on the same path (a sidecar restart).
type Listener struct {
	// Path is the socket path; Endpoint is "unix://" + Path.
	Path, Endpoint string

	t    testing.TB
	srv  *Server
	mu   sync.Mutex
	grpc *grpc.Server
	done chan error
}

// NewListener returns a Listener for srv on a socket in t.TempDir(), not started; it is stopped
// at the end of the test.
func NewListener(t testing.TB, srv *Server) *Listener {
	t.Helper()
	path := filepath.Join(t.TempDir(), "profiler.sock")
	l := &Listener{Path: path, Endpoint: "unix://" + path, t: t, srv: srv}
	t.Cleanup(l.Stop)
	return l
}

// Start serves on the socket.
func (l *Listener) Start() {
	l.t.Helper()
	lis, err := net.Listen("unix", l.Path)
	if err != nil {
		l.t.Fatalf("declaretest: listen on %s: %v", l.Path, err)
	}
	gs := grpc.NewServer()
	gpumetricsv1.RegisterProfilerIntegrationServiceServer(gs, l.srv)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	l.mu.Lock()
	l.grpc, l.done = gs, done
	l.mu.Unlock()
}

// Stop stops serving at once (open streams break, as when the sidecar dies) and removes the
// socket. It is a no-op when not serving.
func (l *Listener) Stop() {
	l.mu.Lock()
	gs, done := l.grpc, l.done
	l.grpc, l.done = nil, nil
	l.mu.Unlock()
	if gs == nil {
		return
	}
	gs.Stop()
	if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		l.t.Errorf("declaretest: serve: %v", err)
	}
}
