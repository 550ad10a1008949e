package declarer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpumetrics/gpumetrics/collector/internal/declaretest"
	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// recorder is an Observer that keeps what it was told.
type recorder struct {
	mu       sync.Mutex
	resynced [][2]int
	failed   []error
	rejected []string
}

func (r *recorder) Resynced(declared int, released uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resynced = append(r.resynced, [2]int{declared, int(released)})
}

func (r *recorder) StreamFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, err)
}

func (r *recorder) Rejected(pid uint32, field, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected = append(r.rejected, field+": "+reason)
}

func (r *recorder) rejections() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.rejected...)
}

// startClient dials endpoint and returns a started client; the test closes it, the connection
// is closed at the end of the test.
func startClient(t *testing.T, endpoint string, opts Options) *Client {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, conn.Close()) })
	c, err := New(conn, opts)
	require.NoError(t, err)
	require.NoError(t, c.Start())
	return c
}

// newClient is startClient with the client closed at the end of the test.
func newClient(t *testing.T, endpoint string, opts Options) *Client {
	t.Helper()
	c := startClient(t, endpoint, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), declaretest.WaitTimeout)
		defer cancel()
		assert.NoError(t, c.Close(ctx))
	})
	return c
}

// proc is a declaration shaped like the eBPF profiler's resource for pid.
func proc(pid uint32, start uint64, exe string) Process {
	res := pcommon.NewMap()
	res.PutInt("process.pid", int64(pid))
	res.PutStr("process.executable.path", "/usr/bin/"+exe)
	res.PutStr("process.executable.name", exe)
	return Process{PID: pid, StartTimeTicks: start, Resource: res}
}

// kinds renders events as "<stream>:<kind>(<pid>)".
func kinds(events []declaretest.Event) []string { return declaretest.Describe(events) }

func hasSuffix(events []declaretest.Event, want ...string) bool {
	got := kinds(events)
	if len(got) < len(want) {
		return false
	}
	tail := got[len(got)-len(want):]
	for i := range want {
		if tail[i] != want[i] {
			return false
		}
	}
	return true
}

func count(events []declaretest.Event, s string) int {
	n := 0
	for _, k := range kinds(events) {
		if k == s {
			n++
		}
	}
	return n
}

func TestSendsOnlyChangesAfterTheFirstResync(t *testing.T) {
	srv := declaretest.New()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	obs := &recorder{}
	c := newClient(t, lis.Endpoint, Options{Name: "ebpf-profiler/node-1", Observer: obs})

	srv.WaitFor(t, "the first (empty) resync", func(ev []declaretest.Event) bool {
		return hasSuffix(ev, "1:resync_begin", "1:resync_end")
	})
	res, err := c.Declare(proc(10, 500, "python3.11"))
	require.NoError(t, err)
	assert.Equal(t, Changed, res)
	srv.WaitFor(t, "declare(10)", func(ev []declaretest.Event) bool { return hasSuffix(ev, "1:declare(10)") })

	res, err = c.Declare(proc(10, 500, "python3.11"))
	require.NoError(t, err)
	assert.Equal(t, Unchanged, res, "same attributes, same start time")

	res, err = c.Declare(proc(10, 500, "python3.12"))
	require.NoError(t, err)
	assert.Equal(t, Changed, res)
	ev := srv.WaitFor(t, "the changed declare(10)", func(ev []declaretest.Event) bool { return count(ev, "1:declare(10)") == 2 })
	assert.Equal(t, "python3.12", resourceAttr(t, declaretest.LastDeclare(ev, 10), "process.executable.name"))

	assert.True(t, c.Exit(10, 500))
	ev = srv.WaitFor(t, "exit(10)", func(ev []declaretest.Event) bool { return hasSuffix(ev, "1:exit(10)") })
	assert.Equal(t, uint64(500), ev[len(ev)-1].Request.GetExit().GetStartTimeTicks(), "the exit names the start time it was declared with")
	assert.False(t, c.Exit(10, 500), "already released")

	// every stream carries the declarer name
	md := srv.StreamMetadata()
	require.Len(t, md, 1)
	assert.Equal(t, []string{"ebpf-profiler/node-1"}, md[0].Get(MetadataKey))
	assert.Empty(t, md[0].Get("authorization"))

	waitStats(t, c, "declared 2, exits 1", func(s Stats) bool { return s.Declared == 2 && s.Exits == 1 })
	st := c.Stats()
	assert.Equal(t, uint64(1), st.Unchanged)
	assert.Equal(t, uint64(1), st.Resyncs)
	assert.Equal(t, 0, st.Processes)
	assert.True(t, st.Connected)
}

// waitStats polls Stats (the counters are updated by the client's goroutines) until cond holds.
func waitStats(t *testing.T, c *Client, what string, cond func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(declaretest.WaitTimeout)
	for !cond(c.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for stats: %s; got %+v", what, c.Stats())
		}
		time.Sleep(5 * time.Millisecond) // polling interval inside the deadline
	}
}

// resourceAttr returns the string value of key in d's profiler_resource ("" when absent).
func resourceAttr(t *testing.T, d *gpumetricsv1.ProcessDeclaration, key string) string {
	t.Helper()
	for _, kv := range decodeResource(t, d.GetProfilerResource()).GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

func TestReconnectReplaysEverythingBetweenResyncMarkers(t *testing.T) {
	srv := declaretest.New()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("first-token-0123456789"), 0o600))
	token := func() (string, error) {
		b, err := os.ReadFile(tokenFile)
		return string(b), err
	}
	obs := &recorder{}
	c := newClient(t, lis.Endpoint, Options{Name: "agent", Token: token, Observer: obs})
	for _, pid := range []uint32{20, 21, 22} {
		_, err := c.Declare(proc(pid, uint64(pid)*10, "worker"))
		require.NoError(t, err)
	}
	c.Exit(22, 0)
	srv.WaitFor(t, "20 and 21 declared on stream 1", func(ev []declaretest.Event) bool {
		return declaretest.LastDeclare(ev, 20) != nil && declaretest.LastDeclare(ev, 21) != nil
	})
	waitStats(t, c, "stream 1 answered", func(s Stats) bool { return s.Declared >= 2 && s.Resyncs == 1 })

	// The sidecar dies and comes back: a new stream replays the held set, 22 is not in it.
	lis.Stop()
	require.NoError(t, os.WriteFile(tokenFile, []byte("rotated-token-0123456789"), 0o600))
	lis.Start()
	ev := srv.WaitFor(t, "a resync on stream 2", func(ev []declaretest.Event) bool { return hasSuffix(ev, "2:resync_end") })
	second := declaretest.OnStream(ev, 2)
	require.Len(t, second, 4)
	assert.Equal(t, "2:resync_begin", second[0])
	assert.ElementsMatch(t, []string{"2:declare(20)", "2:declare(21)"}, second[1:3])
	assert.Equal(t, "2:resync_end", second[3])

	md := srv.StreamMetadata()
	require.Len(t, md, 2)
	assert.Equal(t, []string{"Bearer first-token-0123456789"}, md[0].Get("authorization"))
	assert.Equal(t, []string{"Bearer rotated-token-0123456789"}, md[1].Get("authorization"), "the token is read for every stream")

	waitStats(t, c, "two resyncs", func(s Stats) bool { return s.Resyncs == 2 })
	assert.Equal(t, uint64(1), c.Stats().StreamFailures)
	obs.mu.Lock()
	assert.Len(t, obs.failed, 1)
	assert.Equal(t, [2]int{2, 0}, obs.resynced[len(obs.resynced)-1])
	obs.mu.Unlock()
}

func TestSidecarDownAtStart(t *testing.T) {
	srv := declaretest.New()
	lis := declaretest.NewListener(t, srv) // not serving yet
	c := newClient(t, lis.Endpoint, Options{})
	_, err := c.Declare(proc(30, 1, "trainer"))
	require.NoError(t, err)
	st := c.Stats()
	assert.Equal(t, 1, st.Pending, "held, waiting for a stream")
	assert.False(t, st.Connected)

	lis.Start()
	ev := srv.WaitFor(t, "the resync carrying 30", func(ev []declaretest.Event) bool {
		return hasSuffix(ev, "1:resync_begin", "1:declare(30)", "1:resync_end")
	})
	assert.Len(t, ev, 3)
	waitStats(t, c, "connected", func(s Stats) bool { return s.Connected && s.Pending == 0 })
}

func TestRejectedDeclarationIsReportedAndNotResent(t *testing.T) {
	srv := declaretest.New()
	srv.Reject = func(req *gpumetricsv1.StreamDeclarationsRequest) *gpumetricsv1.Rejection {
		if d := req.GetDeclare(); d != nil && d.GetPid() == 41 {
			return &gpumetricsv1.Rejection{Pid: 41, Field: "declare.environment[0].name", Reason: "must match OTEL_[A-Za-z0-9_]*"}
		}
		return nil
	}
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	obs := &recorder{}
	c := newClient(t, lis.Endpoint, Options{Observer: obs})
	bad := proc(41, 1, "x")
	bad.Environment = []EnvVar{{Name: "PATH", Value: []byte("/bin")}}
	_, err := c.Declare(bad)
	require.NoError(t, err)
	_, err = c.Declare(proc(42, 1, "y"))
	require.NoError(t, err)
	waitStats(t, c, "one rejected, one declared", func(s Stats) bool { return s.Rejected == 1 && s.Declared == 1 })
	assert.Equal(t, []string{"declare.environment[0].name: must match OTEL_[A-Za-z0-9_]*"}, obs.rejections())

	res, err := c.Declare(bad)
	require.NoError(t, err)
	assert.Equal(t, Unchanged, res, "a rejection is deterministic: the same declaration is not sent again")
	assert.Equal(t, 1, count(srv.Events(), "1:declare(41)"))
}

func TestFullQueueRefusesNewProcessesOnly(t *testing.T) {
	conn, err := grpc.NewClient("unix:///nonexistent/gpumetrics.sock", grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	c, err := New(conn, Options{MaxProcesses: 2})
	require.NoError(t, err)
	for _, pid := range []uint32{1, 2} {
		_, err := c.Declare(proc(pid, 1, "a"))
		require.NoError(t, err)
	}
	_, err = c.Declare(proc(3, 1, "a"))
	require.ErrorIs(t, err, ErrFull)
	res, err := c.Declare(proc(2, 1, "b"))
	require.NoError(t, err, "a held process is still updated")
	assert.Equal(t, Changed, res)
	assert.True(t, c.Exit(1, 0))
	_, err = c.Declare(proc(3, 1, "a"))
	require.NoError(t, err, "room again after an exit")
	st := c.Stats()
	assert.Equal(t, uint64(1), st.Full)
	assert.Equal(t, 2, st.Processes)

	err = c.Resync([]Process{proc(5, 1, "a"), proc(6, 1, "a"), proc(7, 1, "a")})
	require.ErrorIs(t, err, ErrFull)
	assert.Equal(t, 2, c.Stats().Processes)
	require.NoError(t, c.Close(context.Background()), "never started: nothing to flush")
	_, err = c.Declare(proc(8, 1, "a"))
	require.ErrorIs(t, err, ErrClosed)
}

func TestResyncReplacesTheHeldSet(t *testing.T) {
	srv := declaretest.New()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	c := newClient(t, lis.Endpoint, Options{})
	_, err := c.Declare(proc(50, 1, "a"))
	require.NoError(t, err)
	srv.WaitFor(t, "declare(50)", func(ev []declaretest.Event) bool { return declaretest.LastDeclare(ev, 50) != nil })

	require.NoError(t, c.Resync([]Process{proc(51, 1, "b"), proc(52, 1, "c")}))
	ev := srv.WaitFor(t, "a second resync", func(ev []declaretest.Event) bool { return count(ev, "1:resync_end") == 2 })
	i := len(ev) - 4
	assert.Equal(t, "1:resync_begin", kinds(ev)[i])
	assert.ElementsMatch(t, []string{"1:declare(51)", "1:declare(52)"}, kinds(ev)[i+1:i+3])
	assert.Equal(t, 2, c.Stats().Processes)
}

// TestDeclareNeverWaitsForTheSidecar: the sidecar takes the first event and never answers;
// Declare and Exit still return at once, the client stops sending at MaxInFlight unanswered
// events, and Close gives up when its context ends.
func TestDeclareNeverWaitsForTheSidecar(t *testing.T) {
	srv := declaretest.New()
	release := srv.HoldAnswers()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	c := startClient(t, lis.Endpoint, Options{MaxInFlight: 2})
	srv.WaitFor(t, "resync_begin (held unanswered)", func(ev []declaretest.Event) bool { return len(ev) == 1 })

	done := make(chan struct{})
	go func() {
		defer close(done)
		for pid := uint32(100); pid < 1100; pid++ {
			if _, err := c.Declare(proc(pid, 1, "w")); err != nil {
				t.Errorf("Declare(%d): %v", pid, err)
			}
		}
		c.Exit(100, 0)
	}()
	select {
	case <-done:
	case <-time.After(declaretest.WaitTimeout):
		t.Fatal("Declare waited for the sidecar")
	}
	st := c.Stats()
	assert.Equal(t, 999, st.Processes)
	assert.Positive(t, st.Pending)
	assert.Len(t, srv.Events(), 1, "the server reads nothing more while it holds an answer")

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := c.Close(ctx)
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	release()
}

func TestCloseFlushesPendingDeclarations(t *testing.T) {
	srv := declaretest.New()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	c := startClient(t, lis.Endpoint, Options{})
	srv.WaitFor(t, "the first resync", func(ev []declaretest.Event) bool { return hasSuffix(ev, "1:resync_end") })
	waitStats(t, c, "connected", func(s Stats) bool { return s.Connected })
	for pid := uint32(60); pid < 70; pid++ {
		_, err := c.Declare(proc(pid, 1, "w"))
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), declaretest.WaitTimeout)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	assert.Equal(t, uint64(10), c.Stats().Declared, "all 10 answered before the stream ended")
	require.NoError(t, c.Close(ctx), "Close twice")
	require.ErrorIs(t, c.Start(), ErrStarted)
}

func TestCloseWhileTheSidecarIsDownReturnsAtOnce(t *testing.T) {
	lis := declaretest.NewListener(t, declaretest.New()) // never serving
	c := startClient(t, lis.Endpoint, Options{})
	_, err := c.Declare(proc(1, 1, "w"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), declaretest.WaitTimeout)
	defer cancel()
	require.NoError(t, c.Close(ctx), "no stream: nothing to flush, no wait for the context")
}

func TestNewValidatesOptions(t *testing.T) {
	_, err := New(nil, Options{Name: "has space"})
	require.ErrorContains(t, err, `declarer: name "has space" must be at most 128 characters of [A-Za-z0-9._:/-]`)
	_, err = New(nil, Options{MaxProcesses: -1})
	require.ErrorContains(t, err, "must not be negative")
}

func TestAResyncSendsItsDeclarationsInBatches(t *testing.T) {
	srv := declaretest.New()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	c := newClient(t, lis.Endpoint, Options{Name: "agent"})
	all := make([]Process, 600)
	for i := range all {
		all[i] = proc(uint32(1000+i), uint64(i), "worker")
	}
	require.NoError(t, c.Resync(all))
	ev := srv.WaitFor(t, "a resync of the 600", func(ev []declaretest.Event) bool {
		return hasSuffix(ev, "1:resync_end") && declaretest.LastDeclare(ev, 1599) != nil
	})
	batches := map[int]int{}
	for _, e := range ev {
		if e.Kind() == "declare" {
			batches[e.Batch]++
		}
	}
	// 600 processes: 256 + 256 + 88, three DeclareBatch events (answered three times, not 600)
	assert.Equal(t, map[int]int{1: batchMax, 2: batchMax, 3: 600 - 2*batchMax}, batches)
	waitStats(t, c, "every declaration answered", func(s Stats) bool {
		return s.Declared == 600 && s.Pending == 0
	})
}

func TestABatchStaysWithinTheSidecarsElementCount(t *testing.T) {
	// 100 processes of 99 environment variables each: 100 elements apiece as the sidecar counts
	// them before parsing (server.max_request_elements), 10 000 in all; one DeclareBatch of
	// them would be refused unparsed at the default 1 MiB receive limit (8192 elements)
	srv := declaretest.New()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	c := newClient(t, lis.Endpoint, Options{Name: "agent"})
	all := make([]Process, 100)
	for i := range all {
		all[i] = proc(uint32(2000+i), uint64(i), "worker")
		for v := 0; v < 99; v++ {
			all[i].Environment = append(all[i].Environment, EnvVar{Name: fmt.Sprintf("V%d", v), Value: []byte("1")})
		}
	}
	require.NoError(t, c.Resync(all))
	ev := srv.WaitFor(t, "a resync of the 100", func(ev []declaretest.Event) bool {
		return hasSuffix(ev, "1:resync_end") && declaretest.LastDeclare(ev, 2099) != nil
	})
	batches := map[int]int{}
	for _, e := range ev {
		if e.Kind() == "declare" {
			batches[e.Batch]++
		}
	}
	per := batchElements / 100 // whole declarations of 100 elements in one batch
	assert.Equal(t, map[int]int{1: per, 2: per, 3: 100 - 2*per}, batches)
	waitStats(t, c, "every declaration answered", func(s Stats) bool {
		return s.Declared == 100 && s.Pending == 0
	})
}

func TestAnOlderSidecarGetsOneDeclareEventPerProcess(t *testing.T) {
	srv := declaretest.New()
	srv.NoBatch = true // answers a DeclareBatch with "event": no event set, as before it existed
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	obs := &recorder{}
	c := newClient(t, lis.Endpoint, Options{Observer: obs})
	for pid := uint32(60); pid < 63; pid++ {
		_, err := c.Declare(proc(pid, 1, "worker"))
		require.NoError(t, err)
	}
	waitStats(t, c, "declared one by one", func(s Stats) bool { return s.Declared == 3 && s.Pending == 0 })
	for _, e := range srv.Events() {
		assert.Zero(t, e.Batch, "after the first batch is refused, no other is sent")
	}
	assert.Zero(t, c.Stats().Rejected, "the refused batch is resent, not counted as rejected")
	assert.Empty(t, obs.rejections())
	// a new process later goes as a declare event too
	_, err := c.Declare(proc(70, 1, "late"))
	require.NoError(t, err)
	srv.WaitFor(t, "declare(70)", func(ev []declaretest.Event) bool { return hasSuffix(ev, "1:declare(70)") })
}

func TestRejectionsInABatchAreReportedPerProcess(t *testing.T) {
	srv := declaretest.New()
	srv.Reject = func(req *gpumetricsv1.StreamDeclarationsRequest) *gpumetricsv1.Rejection {
		if d := req.GetDeclare(); d != nil && d.GetPid() == 82 {
			return &gpumetricsv1.Rejection{Pid: 82, Field: "declare_batch.processes[2].pid", Reason: "too large"}
		}
		return nil
	}
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	obs := &recorder{}
	c := newClient(t, lis.Endpoint, Options{Observer: obs})
	require.NoError(t, c.Resync([]Process{proc(80, 1, "a"), proc(81, 1, "b"), proc(82, 1, "c")}))
	waitStats(t, c, "two declared, one rejected", func(s Stats) bool {
		return s.Declared == 2 && s.Rejected == 1 && s.Pending == 0
	})
	assert.Equal(t, []string{"declare_batch.processes[2].pid: too large"}, obs.rejections())
}
