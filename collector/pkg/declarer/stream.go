package declarer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// eventKind is what one stream message carried, to account for its answer.
type eventKind int

const (
	kindDeclare eventKind = iota
	kindExit
	kindResyncBegin
	kindResyncEnd
	kindDeclareBatch
)

// Declarations go in DeclareBatch events of at most batchMax entries, batchBytes encoded bytes
// and batchElements repeated elements (the first one that is reached), below the sidecar's
// defaults: server.max_declarations_per_request 4096, a 1 MiB message
// (server.max_receive_message_bytes), and the 8192 repeated elements it counts in a message of
// that size before parsing it (server.max_request_elements: each entry and each of its
// environment variables is one). A single declaration over a bound goes alone.
const (
	batchMax      = 256
	batchBytes    = 512 << 10
	batchElements = 4096
)

// sentEvent is a message sent and not yet answered (the sidecar answers every message once, in
// order).
type sentEvent struct {
	kind  eventKind
	pid   uint32
	count int      // kindResyncEnd: the processes replayed
	pids  []uint32 // kindDeclareBatch: the processes declared, in order
	// answer, when set, receives the answer once it is accounted (the first batch of a stream
	// waits for it: whether this sidecar takes DeclareBatch at all)
	answer chan *gpumetricsv1.StreamDeclarationsResponse
}

// batching says whether the sidecar of this stream takes DeclareBatch events.
type batching int

const (
	batchUnknown batching = iota // no batch answered yet on this stream
	batchYes
	batchNo // an older sidecar: "event" rejected; one declare event per process
)

// heldState is what the current stream told the sidecar about one pid.
type heldState struct {
	fp    uint64
	start uint64
}

// session is one StreamDeclarations stream: the sending side runs in Client.run's goroutine,
// the receiving side in its own.
type session struct {
	c        *Client
	ctx      context.Context
	stream   grpc.BidiStreamingClient[gpumetricsv1.StreamDeclarationsRequest, gpumetricsv1.StreamDeclarationsResponse]
	inflight chan sentEvent
	held     map[uint32]heldState

	broken   chan struct{} // closed by receive when the stream ended; recvErr says how
	recvErr  error
	answered atomic.Bool // the sidecar answered at least one event
	batching batching    // the sending goroutine's
	pending  []change    // declarations gathered for the next DeclareBatch
	size     int         // their encoded bytes
	elements int         // their repeated elements, as the sidecar counts them
}

var (
	errStreamEnded = errors.New("the sidecar ended the declaration stream")
	errUnexpected  = errors.New("the sidecar answered more events than were sent")
)

// stream opens one stream and keeps it until it breaks or the client closes. progressed reports
// whether the sidecar answered anything (the backoff then starts over).
func (c *Client) stream() (progressed bool, err error) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	md := metadata.MD{}
	if c.opts.Name != "" {
		md.Set(MetadataKey, c.opts.Name)
	}
	if c.opts.Token != nil {
		tok, err := c.opts.Token()
		if err != nil {
			return false, fmt.Errorf("declare token: %w", err)
		}
		if tok != "" {
			md.Set("authorization", "Bearer "+tok)
		}
	}
	ctx = metadata.NewOutgoingContext(ctx, md)
	// WaitForReady: a sidecar that is down (or not started yet) is waited for, not failed on.
	stream, err := c.rpc.StreamDeclarations(ctx, grpc.WaitForReady(true))
	if err != nil {
		return false, fmt.Errorf("opening the declaration stream: %w", err)
	}
	c.setStreaming(true)
	defer c.setStreaming(false)
	s := &session{
		c:        c,
		ctx:      ctx,
		stream:   stream,
		inflight: make(chan sentEvent, c.opts.MaxInFlight),
		broken:   make(chan struct{}),
	}
	go s.receive()
	err = s.run()
	cancel()
	<-s.broken
	return s.answered.Load(), err
}

// run sends a resynchronisation first, then every change, until the stream breaks or the client
// closes (then it ends the stream cleanly and waits for the last answers).
func (s *session) run() error {
	first := true
	for {
		resync, batch, closing := s.c.take(first)
		first = false
		var err error
		switch {
		case resync:
			err = s.resync(batch)
		case len(batch) > 0:
			err = s.apply(batch)
		case closing:
			return s.finish()
		default:
			select {
			case <-s.c.wake:
			case <-s.broken:
				return s.brokenErr()
			case <-s.ctx.Done():
				return s.ctx.Err()
			}
		}
		if err != nil {
			return err
		}
	}
}

// change is one pid to bring up to date: its latest declaration, or nil when it exited.
type change struct {
	pid uint32
	e   *entry
}

// take returns what to send next: every held process when a resynchronisation is due (always
// first on a new stream), else the pids changed since the last take. closing reports Close.
func (c *Client) take(newStream bool) (resync bool, batch []change, closing bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if newStream || c.resyncDue {
		c.resyncDue = false
		clear(c.dirty)
		batch = make([]change, 0, len(c.desired))
		for pid, e := range c.desired {
			batch = append(batch, change{pid, e})
		}
		c.unsent.Store(int64(len(batch)))
		return true, batch, c.closing
	}
	if len(c.dirty) > 0 {
		batch = make([]change, 0, len(c.dirty))
		for pid := range c.dirty {
			batch = append(batch, change{pid, c.desired[pid]})
		}
		clear(c.dirty)
		c.unsent.Store(int64(len(batch)))
	}
	return false, batch, c.closing
}

// resync replays batch between ResyncBegin and ResyncEnd; the sidecar then releases every earlier
// declaration of this declarer that was not replayed.
func (s *session) resync(batch []change) error {
	begin := &gpumetricsv1.StreamDeclarationsRequest{Event: &gpumetricsv1.StreamDeclarationsRequest_ResyncBegin{ResyncBegin: &gpumetricsv1.ResyncBegin{}}}
	if err := s.send(begin, sentEvent{kind: kindResyncBegin}); err != nil {
		return err
	}
	s.held = make(map[uint32]heldState, len(batch))
	for _, ch := range batch {
		if err := s.declare(ch.pid, ch.e); err != nil {
			return err
		}
	}
	if err := s.flush(); err != nil {
		return err
	}
	end := &gpumetricsv1.StreamDeclarationsRequest{Event: &gpumetricsv1.StreamDeclarationsRequest_ResyncEnd{ResyncEnd: &gpumetricsv1.ResyncEnd{}}}
	return s.send(end, sentEvent{kind: kindResyncEnd, count: len(batch)})
}

// apply sends a declaration for each changed process and an exit for each released one the
// stream had declared.
func (s *session) apply(batch []change) error {
	for _, ch := range batch {
		held, ok := s.held[ch.pid]
		switch {
		case ch.e != nil && ok && held.fp == ch.e.fp:
			s.c.unsent.Add(-1) // changed and changed back before it was sent
		case ch.e != nil:
			if err := s.declare(ch.pid, ch.e); err != nil {
				return err
			}
		case ok:
			s.c.unsent.Add(-1)
			delete(s.held, ch.pid)
			exit := &gpumetricsv1.StreamDeclarationsRequest{Event: &gpumetricsv1.StreamDeclarationsRequest_Exit{
				Exit: &gpumetricsv1.ProcessExit{Pid: ch.pid, StartTimeTicks: held.start},
			}}
			if err := s.send(exit, sentEvent{kind: kindExit, pid: ch.pid}); err != nil {
				return err
			}
		default:
			s.c.unsent.Add(-1)
		}
	}
	return s.flush()
}

// declare gathers pid's declaration for the next DeclareBatch (sent when it is full, or by
// flush), or sends it as a declare event to a sidecar that takes no batches.
func (s *session) declare(pid uint32, e *entry) error {
	s.held[pid] = heldState{fp: e.fp, start: e.decl.GetStartTimeTicks()}
	if s.batching == batchNo {
		s.c.unsent.Add(-1)
		return s.declareOne(pid, e)
	}
	size := proto.Size(e.decl)
	elements := 1 + len(e.decl.GetEnvironment())
	if len(s.pending) > 0 && (s.size+size > batchBytes || s.elements+elements > batchElements) {
		if err := s.flush(); err != nil {
			return err
		}
	}
	s.pending = append(s.pending, change{pid, e})
	s.size += size
	s.elements += elements
	if len(s.pending) >= batchMax {
		return s.flush()
	}
	return nil
}

func (s *session) declareOne(pid uint32, e *entry) error {
	req := &gpumetricsv1.StreamDeclarationsRequest{Event: &gpumetricsv1.StreamDeclarationsRequest_Declare{Declare: e.decl}}
	return s.send(req, sentEvent{kind: kindDeclare, pid: pid})
}

// flush sends the gathered declarations as one DeclareBatch. The first batch of a stream waits
// for its answer: a sidecar that does not know DeclareBatch (it answers "event", no event set)
// gets those declarations again one declare event each, and every later one too.
func (s *session) flush() error {
	batch := s.pending
	if len(batch) == 0 {
		return nil
	}
	s.pending, s.size, s.elements = nil, 0, 0
	if s.batching == batchNo {
		for _, ch := range batch {
			s.c.unsent.Add(-1)
			if err := s.declareOne(ch.pid, ch.e); err != nil {
				return err
			}
		}
		return nil
	}
	decls := make([]*gpumetricsv1.ProcessDeclaration, len(batch))
	pids := make([]uint32, len(batch))
	for i, ch := range batch {
		decls[i], pids[i] = ch.e.decl, ch.pid
	}
	ev := sentEvent{kind: kindDeclareBatch, pids: pids}
	if s.batching == batchUnknown {
		ev.answer = make(chan *gpumetricsv1.StreamDeclarationsResponse, 1)
	}
	req := &gpumetricsv1.StreamDeclarationsRequest{Event: &gpumetricsv1.StreamDeclarationsRequest_DeclareBatch{
		DeclareBatch: &gpumetricsv1.DeclareBatch{Processes: decls},
	}}
	if err := s.send(req, ev); err != nil {
		return err
	}
	s.c.unsent.Add(-int64(len(batch)))
	if ev.answer == nil {
		return nil
	}
	select {
	case resp := <-ev.answer:
		if !batchUnknownEvent(resp) {
			s.batching = batchYes
			return nil
		}
	case <-s.broken:
		return s.brokenErr()
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	s.batching = batchNo
	s.c.unsent.Add(int64(len(batch)))
	s.pending = batch
	return s.flush()
}

// batchUnknownEvent tells whether resp is an older sidecar's answer to an event it does not
// know: nothing was applied and the declarations must be sent as declare events.
func batchUnknownEvent(resp *gpumetricsv1.StreamDeclarationsResponse) bool {
	return !resp.GetAccepted() && resp.GetRejection().GetField() == "event"
}

// send records ev as awaiting its answer (waiting while MaxInFlight events are unanswered) and
// sends req.
func (s *session) send(req *gpumetricsv1.StreamDeclarationsRequest, ev sentEvent) error {
	select {
	case s.inflight <- ev:
		switch ev.kind {
		case kindDeclare, kindExit:
			s.c.unanswered.Add(1)
		case kindDeclareBatch:
			s.c.unanswered.Add(int64(len(ev.pids)))
		}
	case <-s.broken:
		return s.brokenErr()
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	if err := s.stream.Send(req); err != nil {
		if errors.Is(err, io.EOF) { // the stream's status is what Recv returns
			<-s.broken
			return s.brokenErr()
		}
		return err
	}
	return nil
}

// finish ends the stream after the last event and waits for the answers to everything sent.
func (s *session) finish() error {
	if err := s.stream.CloseSend(); err != nil {
		return err
	}
	select {
	case <-s.broken:
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	if s.recvErr != nil && !errors.Is(s.recvErr, errStreamEnded) {
		return s.recvErr
	}
	if n := len(s.inflight); n > 0 {
		return fmt.Errorf("the sidecar ended the stream with %d events unanswered", n)
	}
	return nil
}

func (s *session) brokenErr() error {
	if s.recvErr == nil {
		return errStreamEnded
	}
	return s.recvErr
}

// receive reads the answers, accounts each against the event it answers, and closes broken when
// the stream ends.
func (s *session) receive() {
	defer close(s.broken)
	c := s.c
	for {
		resp, err := s.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errStreamEnded
			}
			s.recvErr = err
			return
		}
		var ev sentEvent
		select {
		case ev = <-s.inflight:
		default:
			s.recvErr = errUnexpected
			return
		}
		s.answered.Store(true)
		switch ev.kind {
		case kindDeclare, kindExit:
			c.unanswered.Add(-1)
		case kindDeclareBatch:
			c.unanswered.Add(-int64(len(ev.pids)))
		}
		s.account(c, ev, resp)
		if ev.answer != nil {
			ev.answer <- resp
		}
	}
}

func (s *session) account(c *Client, ev sentEvent, resp *gpumetricsv1.StreamDeclarationsResponse) {
	if ev.kind == kindDeclareBatch {
		s.accountBatch(c, ev, resp)
		return
	}
	if !resp.GetAccepted() {
		c.rejected.Add(1)
		if c.opts.Observer != nil {
			r := resp.GetRejection()
			c.opts.Observer.Rejected(ev.pid, r.GetField(), r.GetReason())
		}
		return
	}
	switch ev.kind {
	case kindDeclare:
		c.declared.Add(1)
	case kindExit:
		c.exits.Add(1)
	case kindResyncEnd:
		c.resyncs.Add(1)
		c.released.Add(uint64(resp.GetReleased()))
		c.connected.Store(true)
		if c.opts.Observer != nil {
			c.opts.Observer.Resynced(ev.count, resp.GetReleased())
		}
	case kindResyncBegin:
	}
}

// accountBatch counts a DeclareBatch's answer: each entry declared or rejected (its index says
// which); a batch refused whole is counted per entry, except an older sidecar's "event" answer,
// which the sender resends as declare events.
func (s *session) accountBatch(c *Client, ev sentEvent, resp *gpumetricsv1.StreamDeclarationsResponse) {
	if batchUnknownEvent(resp) && ev.answer != nil {
		return
	}
	c.declared.Add(uint64(resp.GetDeclared()))
	rejections := resp.GetRejections()
	if r := resp.GetRejection(); r != nil && !resp.GetAccepted() && len(rejections) == 0 {
		c.rejected.Add(uint64(len(ev.pids))) // refused whole (e.g. more entries than allowed)
		if c.opts.Observer != nil {
			for _, pid := range ev.pids {
				c.opts.Observer.Rejected(pid, r.GetField(), r.GetReason())
			}
		}
		return
	}
	c.rejected.Add(uint64(len(rejections)))
	if c.opts.Observer != nil {
		for _, r := range rejections {
			pid := r.GetPid()
			if i := int(r.GetIndex()); i < len(ev.pids) {
				pid = ev.pids[i]
			}
			c.opts.Observer.Rejected(pid, r.GetField(), r.GetReason())
		}
	}
}
