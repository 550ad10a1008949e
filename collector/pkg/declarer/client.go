package declarer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

const (
	// DefaultMaxProcesses is Options.MaxProcesses when it is 0.
	DefaultMaxProcesses = 32768
	// DefaultMaxInFlight is Options.MaxInFlight when it is 0.
	DefaultMaxInFlight = 1024
	// MetadataKey is the gRPC metadata key that names the declarer (docs/protocol.md).
	MetadataKey = "gpumetrics-declarer"

	maxNameLen = 128
)

// namePattern is the sidecar's rule for the gpumetrics-declarer metadata value.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]*$`)

var (
	// ErrFull is returned by Declare (and Resync) when a new process would exceed
	// Options.MaxProcesses; processes already held are still updated.
	ErrFull = errors.New("declarer: the most processes the client holds (MaxProcesses) are held; the new one is not declared")
	// ErrClosed is returned by Declare, Exit and Resync after Close.
	ErrClosed = errors.New("declarer: the client is closed")
	// ErrStarted is returned by Start on a client already started or closed.
	ErrStarted = errors.New("declarer: Start called twice or after Close")
)

// Options configure a Client. The zero value is valid: the unnamed declarer, no token, the
// default limits, no observer.
type Options struct {
	// Name is sent as the gpumetrics-declarer metadata: 1-128 characters of [A-Za-z0-9._:/-],
	// or "" for the unnamed declarer. A resynchronisation replaces what this name declared, so
	// use one stable name per agent (the same after a restart), distinct from other agents
	// declaring to the same sidecar.
	Name string
	// Token returns the bearer token ("authorization: Bearer <token>", a declare token,
	// docs/security.md) for each new stream; "" sends none. Nil: no token. An error fails that
	// stream attempt, which is retried after the backoff.
	Token func() (string, error)
	// MaxProcesses bounds the processes held (default DefaultMaxProcesses); memory is about the
	// size of each process's encoded declaration, a few hundred bytes for the eBPF profiler's
	// resource.
	MaxProcesses int
	// MaxInFlight bounds the events sent and not yet answered (default DefaultMaxInFlight); the
	// client waits for answers beyond it, so a slow sidecar holds at most this many events.
	MaxInFlight int
	// Observer is told about resynchronisations, failed streams and rejected events (nil: no one).
	Observer Observer
}

// Observer receives the client's events. Its methods are called from the client's own
// goroutines, one at a time per kind, and must not block for long.
type Observer interface {
	// Resynced reports a completed resynchronisation: declared processes were replayed between
	// ResyncBegin and ResyncEnd, and the sidecar released `released` stale declarations of
	// this declarer.
	Resynced(declared int, released uint32)
	// StreamFailed reports that a stream could not be opened or broke (err says why); the
	// client opens a new one after a backoff (100 ms doubling to 5 s) and resynchronises.
	StreamFailed(err error)
	// Rejected reports an event the sidecar refused: field names it (e.g.
	// "declare.environment[0].name"), reason says why. A rejected declaration is not sent
	// again until the process's declaration changes.
	Rejected(pid uint32, field, reason string)
}

// Result says what Declare did.
type Result int

const (
	// Changed: the process is new or its declaration changed; it will be sent.
	Changed Result = iota
	// Unchanged: the process's declaration is the one already held; nothing is sent.
	Unchanged
)

// Stats are the client's counters since New (counts) and its current state.
type Stats struct {
	// Processes is the number of processes held: the set replayed at every resynchronisation.
	Processes int
	// Pending is the number of declarations and exits not yet answered by the sidecar: waiting
	// to be sent, or sent and unanswered. While no stream is open (or a resynchronisation is
	// due) it is every held process, all of which the next resynchronisation sends.
	Pending int
	// Declared counts declarations the sidecar accepted.
	Declared uint64
	// Unchanged counts Declare calls that found the same declaration held (nothing sent).
	Unchanged uint64
	// Rejected counts events the sidecar rejected.
	Rejected uint64
	// Full counts processes refused because MaxProcesses were held.
	Full uint64
	// Exits counts exits the sidecar accepted.
	Exits uint64
	// Resyncs counts resynchronisations the sidecar completed.
	Resyncs uint64
	// Released counts declarations the sidecar released at the end of a resynchronisation.
	Released uint64
	// StreamFailures counts streams that could not be opened or broke.
	StreamFailures uint64
	// Connected reports whether a stream is open and its resynchronisation answered.
	Connected bool
}

// Client declares processes to a gpumetrics sidecar over one
// gpumetrics.v1.ProfilerIntegrationService/StreamDeclarations stream. Declare, Exit and Resync
// only record the wanted state and return at once; one goroutine (Start) keeps the stream open,
// sends what changed and, after every (re)connect, replays every held process between
// ResyncBegin and ResyncEnd, so the sidecar releases what this declarer no longer holds. All
// methods are safe for concurrent use.
type Client struct {
	rpc  gpumetricsv1.ProfilerIntegrationServiceClient
	opts Options

	mu        sync.Mutex
	desired   map[uint32]*entry   // the latest declaration of every held process
	dirty     map[uint32]struct{} // pids whose latest state the current stream has not been sent
	resyncDue bool                // replay everything on the current stream (Resync was called)
	streaming bool                // a stream is open
	started   bool
	closing   bool

	wake    chan struct{} // capacity 1: something changed
	closeCh chan struct{} // closed by Close
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine returned

	declared, unchanged, rejected, full, exits, resyncs, released, streamFailures atomic.Uint64
	connected                                                                     atomic.Bool
	// unsent counts the changes the sender took and has not sent yet; unanswered the events
	// sent on the current stream and not answered yet (both 0 between streams).
	unsent, unanswered atomic.Int64
}

// New returns a Client that declares over conn (a connection to the sidecar's profiler
// listener; the caller dials it, with TLS or mTLS as needed, and closes it after Close).
// Call Start to begin sending.
//
// Errors: Options.Name not 0-128 characters of [A-Za-z0-9._:/-]; a negative limit.
func New(conn grpc.ClientConnInterface, opts Options) (*Client, error) {
	if len(opts.Name) > maxNameLen || !namePattern.MatchString(opts.Name) {
		return nil, fmt.Errorf("declarer: name %q must be at most %d characters of [A-Za-z0-9._:/-]", opts.Name, maxNameLen)
	}
	if opts.MaxProcesses < 0 || opts.MaxInFlight < 0 {
		return nil, errors.New("declarer: MaxProcesses and MaxInFlight must not be negative")
	}
	if opts.MaxProcesses == 0 {
		opts.MaxProcesses = DefaultMaxProcesses
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		rpc:     gpumetricsv1.NewProfilerIntegrationServiceClient(conn),
		opts:    opts,
		desired: make(map[uint32]*entry),
		dirty:   make(map[uint32]struct{}),
		wake:    make(chan struct{}, 1),
		closeCh: make(chan struct{}),
		ctx:     ctx,
		cancel:  cancel,
		done:    make(chan struct{}),
	}, nil
}

// Start starts the goroutine that keeps the stream. A sidecar that is down is waited for: the
// client connects when it comes up. Errors: ErrStarted.
func (c *Client) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.closing {
		return ErrStarted
	}
	c.started = true
	go c.run()
	return nil
}

// Declare records p as the latest declaration of p.PID (a pid seen again with other attributes
// or another start time replaces the old one: latest wins) and returns at once; the declaration
// is sent by the client's goroutine. It returns Unchanged when the same declaration is already
// held. Errors: ErrInvalidPID, ErrFull (MaxProcesses other processes are held), ErrClosed, or a
// resource that cannot be encoded.
func (c *Client) Declare(p Process) (Result, error) {
	if p.PID == 0 {
		return Changed, ErrInvalidPID
	}
	fp := Fingerprint(p)
	c.mu.Lock()
	old := c.desired[p.PID]
	switch {
	case c.closing:
		c.mu.Unlock()
		return Changed, ErrClosed
	case old != nil && old.fp == fp:
		c.mu.Unlock()
		c.unchanged.Add(1)
		return Unchanged, nil
	case old == nil && len(c.desired) >= c.opts.MaxProcesses:
		c.mu.Unlock()
		c.full.Add(1)
		return Changed, ErrFull
	}
	c.mu.Unlock()
	e, err := newEntry(p, fp) // encoded outside the lock: only a change costs an encoding
	if err != nil {
		return Changed, err
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return Changed, ErrClosed
	}
	if _, held := c.desired[p.PID]; !held && len(c.desired) >= c.opts.MaxProcesses {
		c.mu.Unlock()
		c.full.Add(1)
		return Changed, ErrFull
	}
	c.desired[p.PID] = e
	c.dirty[p.PID] = struct{}{}
	c.mu.Unlock()
	c.signal()
	return Changed, nil
}

// Exit releases pid: the client stops holding it and tells the sidecar (ProcessExit) if it had
// declared it on the current stream. With startTimeTicks other than 0, a held declaration with
// another known start time is kept (it is another process that reused the pid). It reports
// whether a held process was released.
func (c *Client) Exit(pid uint32, startTimeTicks uint64) bool {
	c.mu.Lock()
	e := c.desired[pid]
	if c.closing || e == nil {
		c.mu.Unlock()
		return false
	}
	if held := e.decl.GetStartTimeTicks(); startTimeTicks != 0 && held != 0 && held != startTimeTicks {
		c.mu.Unlock()
		return false
	}
	delete(c.desired, pid)
	c.dirty[pid] = struct{}{}
	c.mu.Unlock()
	c.signal()
	return true
}

// Resync replaces every held process with all (the agent's complete view) and has the client
// replay it between ResyncBegin and ResyncEnd, so the sidecar releases what this declarer had
// declared and is not in all. Of processes beyond MaxProcesses, and of a pid given twice, the
// first ones are kept; ErrFull then reports the refused ones. Errors: ErrClosed, ErrFull, or the
// first process that cannot be encoded (nothing is replaced then).
func (c *Client) Resync(all []Process) error {
	next := make(map[uint32]*entry, min(len(all), c.opts.MaxProcesses))
	refused := 0
	for _, p := range all {
		if _, dup := next[p.PID]; dup {
			continue
		}
		if len(next) >= c.opts.MaxProcesses {
			refused++
			continue
		}
		e, err := newEntry(p, Fingerprint(p))
		if err != nil {
			return fmt.Errorf("declarer: pid %d: %w", p.PID, err)
		}
		next[p.PID] = e
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	c.desired = next
	clear(c.dirty)
	c.resyncDue = true
	c.mu.Unlock()
	c.signal()
	if refused > 0 {
		c.full.Add(uint64(refused))
		return fmt.Errorf("%w (%d refused)", ErrFull, refused)
	}
	return nil
}

// Stats returns the counters and the current state.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	processes := len(c.desired)
	pending := len(c.dirty) + int(c.unsent.Load()) + int(c.unanswered.Load())
	if !c.streaming || c.resyncDue {
		pending = processes
	}
	c.mu.Unlock()
	return Stats{
		Processes:      processes,
		Pending:        pending,
		Declared:       c.declared.Load(),
		Unchanged:      c.unchanged.Load(),
		Rejected:       c.rejected.Load(),
		Full:           c.full.Load(),
		Exits:          c.exits.Load(),
		Resyncs:        c.resyncs.Load(),
		Released:       c.released.Load(),
		StreamFailures: c.streamFailures.Load(),
		Connected:      c.connected.Load(),
	}
}

// Close stops the client. With a stream open, what is pending is sent first and the stream is
// ended cleanly, until ctx ends (then it is cut, and ctx's error returned); without one, it stops
// at once. Held declarations are not withdrawn: the sidecar keeps them until the processes exit
// or this declarer's next resynchronisation. The connection passed to New is left open.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	c.closing = true
	started, streaming := c.started, c.streaming
	c.mu.Unlock()
	close(c.closeCh)
	if !started {
		c.cancel()
		close(c.done)
		return nil
	}
	if !streaming {
		c.cancel() // nothing to flush on: stop waiting for a connection or a backoff
	}
	c.signal()
	var err error
	select {
	case <-c.done:
	case <-ctx.Done():
		err = fmt.Errorf("declarer: pending declarations not sent before shutdown: %w", ctx.Err())
		c.cancel()
		<-c.done
	}
	c.cancel()
	return err
}

// signal wakes the sending goroutine (it coalesces: one pending wake-up is enough).
func (c *Client) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Client) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

func (c *Client) setStreaming(v bool) {
	c.mu.Lock()
	c.streaming = v
	c.mu.Unlock()
	if !v {
		c.connected.Store(false)
		c.unsent.Store(0)
		c.unanswered.Store(0)
	}
}

// Backoff between stream attempts: 100 ms doubling up to 5 s, each wait ±20 %; it starts over
// after a stream on which the sidecar answered.
const (
	backoffBase = 100 * time.Millisecond
	backoffMax  = 5 * time.Second
)

// run keeps a stream open until Close.
func (c *Client) run() {
	defer close(c.done)
	delay := backoffBase
	for {
		progressed, err := c.stream()
		if c.isClosing() {
			return
		}
		c.streamFailures.Add(1)
		if c.opts.Observer != nil {
			c.opts.Observer.StreamFailed(err)
		}
		if progressed {
			delay = backoffBase
		}
		t := time.NewTimer(jitter(delay))
		select {
		case <-t.C:
		case <-c.closeCh:
			t.Stop()
			return
		}
		delay = min(2*delay, backoffMax)
	}
}

// jitter returns d ±20 %.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d)) //nolint:gosec // jitter, not a secret
}
