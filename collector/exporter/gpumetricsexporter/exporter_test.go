package gpumetricsexporter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap/zapcore"

	"github.com/gpumetrics/gpumetrics/collector/internal/declaretest"
	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// The two processes the recording was made for (testdata/ebpf-profiler/README.md).
const (
	recordedTrainer   = 9542 // OTEL_SERVICE_NAME=gpu-trainer and OTEL_RESOURCE_ATTRIBUTES
	recordedInference = 9543 // OTEL_SERVICE_NAME=inference-api, in a container
	recordedContainer = "c65dedadcb5294cd8b41e7ae6da375613837b0ca7c004ca7be621733b8e1e30b"
)

func resourcePIDs(pd pprofile.Profiles) []uint32 {
	var out []uint32
	for i := range pd.ResourceProfiles().Len() {
		pid, ok := processPID(pd.ResourceProfiles().At(i).Resource().Attributes())
		if ok {
			out = append(out, pid)
		}
	}
	return out
}

func allDeclared(pids []uint32) func([]declaretest.Event) bool {
	return func(ev []declaretest.Event) bool {
		for _, pid := range pids {
			if declaretest.LastDeclare(ev, pid) == nil {
				return false
			}
		}
		return true
	}
}

func envOf(d *gpumetricsv1.ProcessDeclaration) map[string]string {
	out := map[string]string{}
	for _, e := range d.GetEnvironment() {
		out[e.GetName()] = string(e.GetValue())
	}
	return out
}

// TestRecordedProfilesAreDeclaredAsTheyArrive feeds the real profiler's reports: every resource
// is declared with exactly its attributes, the OTEL_* variables among them and the start time
// from proc_root; the second report repeats the two recorded processes with the environment
// variables in another order, which is no change.
func TestRecordedProfilesAreDeclaredAsTheyArrive(t *testing.T) {
	reports := recorded(t)
	r := newRig(t, true, nil)
	first, second := resourcePIDs(reports[0]), resourcePIDs(reports[1])
	for _, pid := range append(append([]uint32{}, first...), second...) {
		r.proc.set(pid, 100_000+uint64(pid))
	}
	require.Contains(t, first, uint32(recordedTrainer))
	require.Contains(t, first, uint32(recordedInference))

	r.consume(t, reports[0])
	events := r.srv.WaitFor(t, "every process of report 1", allDeclared(first))
	rps := reports[0].ResourceProfiles()
	for i := range rps.Len() {
		attrs := rps.At(i).Resource().Attributes()
		pid, _ := processPID(attrs)
		d := declaretest.LastDeclare(events, pid)
		assert.Equal(t, attrs.AsRaw(), declaredAttrs(t, d), "pid %d: profiler_resource is the resource as it arrived", pid)
		assert.Equal(t, 100_000+uint64(pid), d.GetStartTimeTicks(), "pid %d", pid)
		assert.Empty(t, d.GetProcessContext())
	}
	trainer := declaretest.LastDeclare(events, recordedTrainer)
	assert.Equal(t, map[string]string{
		"OTEL_SERVICE_NAME":        "gpu-trainer",
		"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=recording,service.version=1.2.3",
	}, envOf(trainer))
	assert.Equal(t, "OTEL_RESOURCE_ATTRIBUTES", trainer.GetEnvironment()[0].GetName(), "sorted by name")
	inference := declaretest.LastDeclare(events, recordedInference)
	assert.Equal(t, map[string]string{"OTEL_SERVICE_NAME": "inference-api"}, envOf(inference))
	assert.Equal(t, recordedContainer, declaredAttrs(t, inference)["container.id"])

	r.consume(t, reports[1])
	events = r.srv.WaitFor(t, "every process of report 2", allDeclared(second))
	assert.Equal(t, 1, countKind(events, "declare", recordedTrainer), "same attributes in another order: unchanged")
	assert.Equal(t, 1, countKind(events, "declare", recordedInference))
	assert.GreaterOrEqual(t, r.env.metric(t, "otelcol_gpumetrics_exporter_processes_unchanged"), int64(2))
	assert.Equal(t, int64(0), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed"))
}

func TestFingerprintChangesAreSentAndNothingElse(t *testing.T) {
	r := newRig(t, true, nil)
	r.proc.set(100, 5000)
	p := profilerProcess{pid: 100, exe: "/usr/bin/python3.11", env: map[string]string{"OTEL_SERVICE_NAME": "a"}}
	r.consume(t, profiles(p))
	r.srv.WaitFor(t, "declare(100)", func(ev []declaretest.Event) bool { return declaretest.LastDeclare(ev, 100) != nil })

	r.consume(t, profiles(p))
	r.consume(t, profiles(p))

	p.env = map[string]string{"OTEL_SERVICE_NAME": "b"}
	r.consume(t, profiles(p))
	events := r.srv.WaitFor(t, "the changed declare(100)", func(ev []declaretest.Event) bool { return countKind(ev, "declare", 100) == 2 })
	assert.Equal(t, "b", envOf(declaretest.LastDeclare(events, 100))["OTEL_SERVICE_NAME"])

	// The pid is reused by a new process with the very same resource: its profiles cost no
	// procfs read, so the next sweep finds the new start time, releases the old process, and
	// the next profile declares the new one with its own start time.
	r.proc.set(100, 7000)
	r.consume(t, profiles(p))
	assert.Equal(t, int64(3), r.env.metric(t, "otelcol_gpumetrics_exporter_processes_unchanged"))
	r.sweep()
	r.consume(t, profiles(p))
	events = r.srv.WaitFor(t, "declare(100) with the new start time", func(ev []declaretest.Event) bool { return countKind(ev, "declare", 100) == 3 })
	assert.Equal(t, uint64(7000), declaretest.LastDeclare(events, 100).GetStartTimeTicks())
	// (The old process's exit and the new declaration may coalesce into the declaration alone,
	// which replaces the old one in the sidecar: latest wins.)
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_processes_exited", attribute.String("reason", "restarted")))
	waitMetric(t, r.env, "otelcol_gpumetrics_exporter_processes_declared", 3)
}

// waitMetric waits until the internal telemetry metric name reaches want (the declarer's
// counters move when the sidecar's answers arrive).
func waitMetric(t testing.TB, env *testEnv, name string, want int64, attrs ...attribute.KeyValue) {
	t.Helper()
	deadline := time.Now().Add(declaretest.WaitTimeout)
	for env.metric(t, name, attrs...) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s %v = %d, want %d", name, attrs, env.metric(t, name, attrs...), want)
		}
		time.Sleep(5 * time.Millisecond) // polling interval inside the deadline
	}
}

func TestExitsAreDetectedAndSent(t *testing.T) {
	r := newRig(t, true, nil)
	for _, pid := range []uint32{200, 201, 202, 203} {
		r.proc.set(pid, 10*uint64(pid))
	}
	procs := []profilerProcess{{pid: 200, exe: "/bin/a"}, {pid: 201, exe: "/bin/b"}, {pid: 202, exe: "/bin/c"}, {pid: 203, exe: "/bin/d"}}
	r.consume(t, profiles(procs...))
	r.srv.WaitFor(t, "four declarations", allDeclared([]uint32{200, 201, 202, 203}))

	r.proc.remove(200)    // exited
	r.proc.set(201, 9999) // its pid now belongs to another process
	r.clock.advance(time.Hour)
	r.consume(t, profiles(procs[2])) // 202 still profiled; 203 is not, but not for expire_after yet
	r.sweep()
	events := r.srv.WaitFor(t, "exit(200) and exit(201)", func(ev []declaretest.Event) bool {
		return countKind(ev, "exit", 200) == 1 && countKind(ev, "exit", 201) == 1
	})
	for _, e := range events {
		if e.Kind() == "exit" {
			pid := e.Request.GetExit().GetPid()
			assert.Equal(t, 10*uint64(pid), e.Request.GetExit().GetStartTimeTicks(), "pid %d: the exit names the start time it was declared with", pid)
		}
	}

	r.clock.advance(90 * time.Minute) // 203 unseen for 2 h 30 min > expire_after (2 h); 202 for 1 h 30 min
	r.sweep()
	events = r.srv.WaitFor(t, "exit(203)", func(ev []declaretest.Event) bool { return countKind(ev, "exit", 203) == 1 })
	assert.Equal(t, 0, countKind(events, "exit", 202), "202 was profiled 90 min ago")
	assert.Equal(t, 3, countKind(events, "exit", 0))

	reason := func(v string) attribute.KeyValue { return attribute.String("reason", v) }
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_processes_exited", reason("gone")))
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_processes_exited", reason("restarted")))
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_processes_exited", reason("expired")))
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_processes"))
	assert.Equal(t, 1, r.exp.tracker.len())

	// The restarted pid's new process is profiled: declared afresh with its own start time.
	r.consume(t, profiles(profilerProcess{pid: 201, exe: "/bin/other"}))
	events = r.srv.WaitFor(t, "declare(201) again", func(ev []declaretest.Event) bool { return countKind(ev, "declare", 201) == 2 })
	assert.Equal(t, uint64(9999), declaretest.LastDeclare(events, 201).GetStartTimeTicks())
}

func TestReconnectResyncsEveryHeldProcess(t *testing.T) {
	r := newRig(t, true, nil)
	for _, pid := range []uint32{300, 301} {
		r.proc.set(pid, 1)
	}
	r.consume(t, profiles(profilerProcess{pid: 300, exe: "/bin/a"}, profilerProcess{pid: 301, exe: "/bin/b"}))
	r.srv.WaitFor(t, "two declarations", allDeclared([]uint32{300, 301}))
	waitMetric(t, r.env, "otelcol_gpumetrics_exporter_processes_declared", 2)

	r.lis.Stop() // the sidecar restarts
	r.lis.Start()
	events := r.srv.WaitFor(t, "a resync on stream 2", func(ev []declaretest.Event) bool {
		last := ev[len(ev)-1]
		return last.Stream == 2 && last.Kind() == "resync_end"
	})
	second := declaretest.OnStream(events, 2)
	require.Len(t, second, 4)
	assert.Equal(t, "2:resync_begin", second[0])
	assert.ElementsMatch(t, []string{"2:declare(300)", "2:declare(301)"}, second[1:3])
	md := r.srv.StreamMetadata()
	assert.Equal(t, []string{"gpumetrics/test"}, md[1].Get("gpumetrics-declarer"), "the component ID names the declarer")
	waitMetric(t, r.env, "otelcol_gpumetrics_exporter_resyncs", 2)
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_stream_failures"))
	assert.Equal(t, 1, r.env.logs.FilterMessageSnippet("declaration stream to the gpumetrics sidecar failed").Len())
}

func TestSidecarDownAtStart(t *testing.T) {
	r := newRig(t, false, nil)
	r.proc.set(400, 1)
	r.consume(t, profiles(profilerProcess{pid: 400, exe: "/bin/trainer"}))
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_queue_size"), "held until a stream opens")

	r.lis.Start()
	events := r.srv.WaitFor(t, "the first resync carrying 400", func(ev []declaretest.Event) bool {
		return len(ev) > 0 && ev[len(ev)-1].Kind() == "resync_end"
	})
	assert.Equal(t, []string{"1:resync_begin", "1:declare(400)", "1:resync_end"}, declaretest.Describe(events))
	waitMetric(t, r.env, "otelcol_gpumetrics_exporter_queue_size", 0)
}

func TestFullQueue(t *testing.T) {
	r := newRig(t, true, func(c *Config) { c.MaxProcesses = 2 })
	for _, pid := range []uint32{500, 501, 502} {
		r.proc.set(pid, 1)
	}
	r.consume(t, profiles(profilerProcess{pid: 500, exe: "/bin/a"}, profilerProcess{pid: 501, exe: "/bin/b"}, profilerProcess{pid: 502, exe: "/bin/c"}))
	r.consume(t, profiles(profilerProcess{pid: 501, exe: "/bin/b2"})) // held: still updated
	events := r.srv.WaitFor(t, "500 and the updated 501 (latest wins)", func(ev []declaretest.Event) bool {
		d := declaretest.LastDeclare(ev, 501)
		return declaretest.LastDeclare(ev, 500) != nil && d != nil && declaredAttrs(t, d)["process.executable.path"] == "/bin/b2"
	})
	assert.Nil(t, declaretest.LastDeclare(events, 502))
	capacity := attribute.String("reason", "capacity")
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", capacity))
	assert.Equal(t, 1, r.env.logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("'max_processes' processes are declared").Len())

	r.proc.remove(500)
	r.sweep()
	r.consume(t, profiles(profilerProcess{pid: 502, exe: "/bin/c"}))
	r.srv.WaitFor(t, "502 once there is room", allDeclared([]uint32{502}))
}

func TestResourcesThatCannotBeDeclared(t *testing.T) {
	r := newRig(t, true, nil)
	pd := pprofile.NewProfiles()
	pd.ResourceProfiles().AppendEmpty().Resource().Attributes().PutStr("process.executable.name", "no-pid")
	pd.ResourceProfiles().AppendEmpty().Resource().Attributes().PutStr("process.pid", "600") // a string does not join
	pd.ResourceProfiles().AppendEmpty().Resource().Attributes().PutInt("process.pid", -1)
	gone := pd.ResourceProfiles().AppendEmpty().Resource().Attributes()
	gone.PutInt("process.pid", 601) // not in proc_root: exited before its profile arrived
	r.proc.set(602, 1)
	ok := pd.ResourceProfiles().AppendEmpty().Resource().Attributes()
	ok.PutInt("process.pid", 602)
	ok.PutStr("process.environment_variable.PATH", "/usr/bin") // any captured name is declared
	ok.PutStr("process.environment_variable.A=B", "x")         // a name the sidecar refuses: resource only
	ok.PutStr("process.environment_variable.OTEL_SERVICE_NAME", "svc")
	r.consume(t, pd)

	events := r.srv.WaitFor(t, "declare(602)", allDeclared([]uint32{602}))
	assert.Equal(t, map[string]string{"OTEL_SERVICE_NAME": "svc", "PATH": "/usr/bin"}, envOf(declaretest.LastDeclare(events, 602)))
	assert.Equal(t, "x", declaredAttrs(t, declaretest.LastDeclare(events, 602))["process.environment_variable.A=B"])
	assert.Equal(t, 1, countKind(events, "declare", 0))
	reason := func(v string) attribute.KeyValue { return attribute.String("reason", v) }
	assert.Equal(t, int64(3), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reason("no_pid")))
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reason("gone")))
	assert.Equal(t, 1, r.env.logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("has no int process.pid").Len(), "logged once at WARN")
}

func TestRejectionsAreCountedAndLoggedOnce(t *testing.T) {
	r := newRig(t, true, nil)
	r.srv.Reject = func(req *gpumetricsv1.StreamDeclarationsRequest) *gpumetricsv1.Rejection {
		if d := req.GetDeclare(); d != nil && d.GetPid() >= 700 {
			return &gpumetricsv1.Rejection{Pid: d.GetPid(), Field: "declare.profiler_resource", Reason: "larger than 65536 bytes"}
		}
		return nil
	}
	for _, pid := range []uint32{700, 701} {
		r.proc.set(pid, 1)
	}
	r.consume(t, profiles(profilerProcess{pid: 700, exe: "/bin/a"}, profilerProcess{pid: 701, exe: "/bin/b"}))
	waitMetric(t, r.env, "otelcol_gpumetrics_exporter_declarations_failed", 2, attribute.String("reason", "rejected"))
	warn := r.env.logs.FilterMessage("The gpumetrics sidecar rejected a declaration")
	require.Equal(t, 2, warn.Len())
	assert.Equal(t, "warn", warn.All()[0].Level.String())
	assert.Equal(t, "debug", warn.All()[1].Level.String())
	assert.Equal(t, "declare.profiler_resource", warn.All()[0].ContextMap()["field"])
}

// TestConsumeNeverWaitsOnTheSidecar: the sidecar takes the first event and never answers; every
// ConsumeProfiles still returns (the test would time out otherwise) and the processes are held.
func TestConsumeNeverWaitsOnTheSidecar(t *testing.T) {
	r := newRig(t, false, nil)
	defer r.srv.HoldAnswers()()
	r.lis.Start()
	r.srv.WaitFor(t, "the first event (unanswered)", func(ev []declaretest.Event) bool { return len(ev) >= 1 })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for batch := range 10 {
			var procs []profilerProcess
			for i := range 100 {
				pid := uint32(10_000 + batch*100 + i)
				r.proc.set(pid, 1)
				procs = append(procs, profilerProcess{pid: pid, exe: "/bin/w"})
			}
			if err := r.exp.consumeProfiles(context.Background(), profiles(procs...)); err != nil {
				t.Errorf("ConsumeProfiles: %v", err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(declaretest.WaitTimeout):
		t.Fatal("ConsumeProfiles waited on the sidecar")
	}
	assert.Equal(t, int64(1000), r.env.metric(t, "otelcol_gpumetrics_exporter_processes"))
	assert.Positive(t, r.env.metric(t, "otelcol_gpumetrics_exporter_queue_size"))
}

func TestConsumeBeforeStartAndAfterShutdownDropsNothingHeld(t *testing.T) {
	env := newTestEnv(t)
	cfg := createDefaultConfig().(*Config)
	cfg.Endpoint = "unix:///nonexistent/profiler.sock"
	exp, err := newProfilesExporter(env.set, cfg)
	require.NoError(t, err)
	require.NoError(t, exp.consumeProfiles(context.Background(), profiles(profilerProcess{pid: 1, exe: "/sbin/init"})))
	assert.Equal(t, 0, exp.tracker.len())
	require.NoError(t, exp.shutdown(context.Background()))
}

// TestShutdownDoesNotWaitForAHungSidecar: the sidecar takes the stream and answers nothing;
// Shutdown with a context without deadline (as the Collector's) still returns once the flush
// timeout (5 s; shortened here) ends, and logs that declarations were not all sent.
func TestShutdownDoesNotWaitForAHungSidecar(t *testing.T) {
	env := newTestEnv(t)
	srv := declaretest.New()
	defer srv.HoldAnswers()()
	lis := declaretest.NewListener(t, srv)
	lis.Start()
	cfg := createDefaultConfig().(*Config)
	cfg.Endpoint = lis.Endpoint
	exp, err := newProfilesExporter(env.set, cfg)
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, exp.flushTimeout)
	exp.flushTimeout = 50 * time.Millisecond
	require.NoError(t, exp.start(context.Background(), componenttest.NewNopHost()))
	srv.WaitFor(t, "the stream (its first event unanswered)", func(ev []declaretest.Event) bool { return len(ev) >= 1 })
	done := make(chan error, 1)
	go func() { done <- exp.shutdown(context.Background()) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(declaretest.WaitTimeout):
		t.Fatal("Shutdown waited for the sidecar")
	}
	assert.Equal(t, 1, env.logs.FilterMessageSnippet("Shut down before every declaration reached the gpumetrics sidecar").Len())
}
