package gpumetricsexporter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gpumetrics/gpumetrics/collector/internal/declaretest"
)

func reasonAttr(v string) attribute.KeyValue { return attribute.String("reason", v) }

// stamp gives resource i of pd's only profile one sample at ts (ns since the Unix epoch).
func stamp(pd pprofile.Profiles, i int, ts uint64) {
	sample := pd.ResourceProfiles().At(i).ScopeProfiles().At(0).Profiles().At(0).Samples().At(0)
	sample.TimestampsUnixNano().Append(ts)
}

// Issue 27 item 3: an exec between two samples of one reporting interval gives one request two
// resources of the pid (the profiler keys resources by executable); the newest by sample time
// is declared, whichever comes first in the request.
func TestTwoResourcesOfOnePidTheNewestIsDeclared(t *testing.T) {
	for _, tc := range []struct {
		name     string
		newFirst bool
	}{{"old then new", false}, {"new then old", true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, true, nil)
			r.proc.set(900, 4000)
			old := profilerProcess{pid: 900, exe: "/usr/bin/python3.11", env: map[string]string{"OTEL_SERVICE_NAME": "a"}}
			cur := profilerProcess{pid: 900, exe: "/usr/bin/dash", env: map[string]string{"OTEL_SERVICE_NAME": "a"}}
			other := profilerProcess{pid: 901, exe: "/bin/other"}
			r.proc.set(901, 1)
			var pd pprofile.Profiles
			if tc.newFirst {
				pd = profiles(cur, other, old)
				stamp(pd, 0, 2_000)
				stamp(pd, 2, 1_000)
			} else {
				pd = profiles(old, other, cur)
				stamp(pd, 0, 1_000)
				stamp(pd, 2, 2_000)
			}
			r.consume(t, pd)
			events := r.srv.WaitFor(t, "declare(900) and declare(901)", allDeclared([]uint32{900, 901}))
			assert.Equal(t, 1, countKind(events, "declare", 900), "only one of the two is declared")
			assert.Equal(t, "/usr/bin/dash", declaredAttrs(t, declaretest.LastDeclare(events, 900))["process.executable.path"])
			logged := r.env.logs.FilterMessage("Declared a profiled process to the gpumetrics sidecar").FilterField(zap.Uint32("pid", 900)).All()
			require.Len(t, logged, 1)
			assert.Equal(t, "/usr/bin/dash", logged[0].ContextMap()["executable"])
		})
	}
}

func TestNewestPerProcessWithoutSampleTimestampsUsesTheProfileWindow(t *testing.T) {
	pd := profiles(profilerProcess{pid: 7, exe: "/a"}, profilerProcess{pid: 7, exe: "/b"}, profilerProcess{pid: 7, exe: "/c"})
	window := func(i int, start, dur uint64) {
		p := pd.ResourceProfiles().At(i).ScopeProfiles().At(0).Profiles().At(0)
		p.SetTime(pcommon.Timestamp(start))
		p.SetDurationNano(dur)
	}
	window(0, 100, 50) // ends at 150
	window(1, 120, 60) // ends at 180: the newest
	window(2, 90, 10)
	assert.Equal(t, []int{1}, newestPerProcess(pd.ResourceProfiles()))

	tie := profiles(profilerProcess{pid: 8, exe: "/a"}, profilerProcess{pid: 9, exe: "/x"}, profilerProcess{pid: 8, exe: "/b"})
	assert.Equal(t, []int{2, 1}, newestPerProcess(tie.ResourceProfiles()), "a tie keeps the later in the request")
}

// Issue 27 item 4: with a proc_root that is not the profiler's pid namespace, pid 1 there is the
// Collector itself; the profile's pid 1 (/sbin/init) must not be declared under it.
func TestAPidOfAnotherPidNamespaceIsNotDeclared(t *testing.T) {
	r := newRig(t, true, func(c *Config) { c.ExitCheckInterval = 10 * time.Second; c.ExpireAfter = time.Hour })
	r.proc.setExe(1, "/otelcol-gpumetrics")
	initProfile := profilerProcess{pid: 1, exe: "/sbin/init"}
	for range 10 {
		r.consume(t, profiles(initProfile))
	}
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reasonAttr("mismatch")),
		"one miss, remembered: the same resource in the next batches is not read again")
	warn := r.env.logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("is another process in 'proc_root'")
	require.Equal(t, 1, warn.Len())
	assert.Contains(t, warn.All()[0].Message, "pid namespace")
	assert.Equal(t, map[string]any{
		"pid": uint32(1), "proc_root": r.proc.root, "attribute": "process.executable.path",
		"profile": "/sbin/init", "proc_root_value": "/otelcol-gpumetrics",
	}, warn.All()[0].ContextMap())

	r.clock.advance(11 * time.Second) // the miss expired: read again (and still not declared)
	r.consume(t, profiles(initProfile))
	assert.Equal(t, int64(2), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reasonAttr("mismatch")))
	assert.Equal(t, 1, r.env.logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("is another process in 'proc_root'").Len(),
		"WARN once, then DEBUG")

	// The same executable, replaced on disk since the profiler read it, is the same process.
	r.proc.set(950, 1)
	r.proc.setExe(950, "/opt/app/server (deleted)")
	r.consume(t, profiles(profilerProcess{pid: 950, exe: "/opt/app/server"}))
	r.srv.WaitFor(t, "declare(950)", allDeclared([]uint32{950}))
	// An unreadable link (a kernel thread, no permission) proves nothing: declared.
	r.proc.set(951, 1)
	r.consume(t, profiles(profilerProcess{pid: 951, exe: "/bin/a"}))
	events := r.srv.WaitFor(t, "declare(951)", allDeclared([]uint32{951}))
	assert.Zero(t, countKind(events, "declare", 1))
	waitMetric(t, r.env, "otelcol_gpumetrics_exporter_processes_declared", 2)
}

func TestACreationTimeThatProcRootContradictsIsNotDeclared(t *testing.T) {
	r := newRig(t, true, nil)
	r.proc.setBootTime(1_700_000_000)
	r.proc.set(960, 12_345) // started 123.45 s after boot
	r.proc.set(961, 12_345)
	pd := profiles(profilerProcess{pid: 960, exe: "/bin/a"}, profilerProcess{pid: 961, exe: "/bin/b"})
	pd.ResourceProfiles().At(0).Resource().Attributes().PutStr("process.creation.time", "2023-11-14T22:15:23.450Z") // matches
	pd.ResourceProfiles().At(1).Resource().Attributes().PutStr("process.creation.time", "2023-11-14T22:25:00.000Z") // 10 min later
	r.consume(t, pd)
	events := r.srv.WaitFor(t, "declare(960)", allDeclared([]uint32{960}))
	assert.Zero(t, countKind(events, "declare", 961))
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reasonAttr("mismatch")))
	warn := r.env.logs.FilterMessageSnippet("is another process in 'proc_root'").All()
	require.Len(t, warn, 1)
	assert.Equal(t, "process.creation.time", warn[0].ContextMap()["attribute"])
	assert.Equal(t, "2023-11-14T22:15:23.45Z", warn[0].ContextMap()["proc_root_value"])
}

// Issue 27 item 4, second part: a pid missing from proc_root (a short-lived process) is counted
// once, not once per batch, until its resource changes or exit_check_interval passes.
func TestAGonePidIsRememberedForABoundedTime(t *testing.T) {
	r := newRig(t, true, func(c *Config) { c.ExitCheckInterval = 10 * time.Second; c.ExpireAfter = time.Hour })
	short := profilerProcess{pid: 970, exe: "/bin/true"}
	for range 10 {
		r.consume(t, profiles(short))
		r.clock.advance(time.Second / 2)
	}
	assert.Equal(t, int64(1), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reasonAttr("gone")))
	r.clock.advance(6 * time.Second)
	r.consume(t, profiles(short))
	assert.Equal(t, int64(2), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reasonAttr("gone")))

	// Another resource for the pid (a new process) is read at once.
	r.proc.set(970, 5)
	r.consume(t, profiles(profilerProcess{pid: 970, exe: "/bin/sleep"}))
	r.srv.WaitFor(t, "declare(970)", allDeclared([]uint32{970}))
}

func TestMissesAreBounded(t *testing.T) {
	m := newMisses(2)
	now := time.Unix(100, 0)
	m.add(1, 11, now, now.Add(time.Second))
	m.add(2, 22, now, now.Add(time.Minute))
	m.add(3, 33, now, now.Add(time.Minute))
	assert.False(t, m.recent(3, 33, now), "full: nothing more is remembered")
	later := now.Add(2 * time.Second)
	m.add(3, 33, later, later.Add(time.Minute)) // pid 1 expired: room
	assert.True(t, m.recent(3, 33, later))
	assert.True(t, m.recent(2, 22, later))
	assert.False(t, m.recent(2, 23, later), "another resource is not a remembered miss")
	assert.False(t, m.recent(1, 11, later))
	assert.Len(t, m.m, 2)
}

// Issue 27 item 2: the profiler sends environment values as raw bytes. The resource is declared
// with each invalid run replaced by U+FFFD (the sidecar's rule for the same bytes read from
// /proc), counted as invalid_utf8, and logged at WARN at most once a minute.
func TestAResourceThatIsNotUTF8IsDeclaredReplacedCountedAndLoggedRateLimited(t *testing.T) {
	r := newRig(t, true, nil)
	for _, pid := range []uint32{980, 981, 982} {
		r.proc.set(pid, 1)
	}
	bad := func(pid uint32) profilerProcess {
		return profilerProcess{pid: pid, exe: "/usr/bin/python3", env: map[string]string{"LANG_NAME": "caf\xe9", "OTEL_SERVICE_NAME": "svc"}}
	}
	r.consume(t, profiles(bad(980)))
	r.consume(t, profiles(bad(980))) // unchanged: not counted or logged again
	r.consume(t, profiles(bad(981)))
	events := r.srv.WaitFor(t, "declare(980) and declare(981)", allDeclared([]uint32{980, 981}))
	d := declaretest.LastDeclare(events, 980)
	assert.Equal(t, "caf\uFFFD", declaredAttrs(t, d)["process.environment_variable.LANG_NAME"])
	assert.Equal(t, "svc", envOf(d)["OTEL_SERVICE_NAME"])
	assert.Equal(t, int64(2), r.env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", reasonAttr("invalid_utf8")))

	r.clock.advance(time.Minute)
	r.consume(t, profiles(bad(982)))
	r.srv.WaitFor(t, "declare(982)", allDeclared([]uint32{982}))
	logged := r.env.logs.FilterMessageSnippet("not UTF-8").All()
	require.Len(t, logged, 3)
	assert.Equal(t, []zapcore.Level{zapcore.WarnLevel, zapcore.DebugLevel, zapcore.WarnLevel},
		[]zapcore.Level{logged[0].Level, logged[1].Level, logged[2].Level})
	assert.Equal(t, int64(1), logged[2].ContextMap()["more_since_last_warning"])
	waitMetric(t, r.env, "otelcol_gpumetrics_exporter_processes_declared", 3)
}

// Issue 27 item 5: the ResourceProfiles' schema_url is declared with the resource.
func TestTheSchemaURLIsDeclared(t *testing.T) {
	r := newRig(t, true, nil)
	r.proc.set(990, 1)
	p := profilerProcess{pid: 990, exe: "/bin/a"}
	r.consume(t, profiles(p))
	events := r.srv.WaitFor(t, "declare(990)", allDeclared([]uint32{990}))
	assert.Equal(t, "https://opentelemetry.io/schemas/1.37.0", declaretest.LastDeclare(events, 990).GetProfilerResourceSchemaUrl())

	pd := profiles(p)
	pd.ResourceProfiles().At(0).SetSchemaUrl("https://opentelemetry.io/schemas/1.38.0")
	r.consume(t, pd)
	events = r.srv.WaitFor(t, "the re-declaration", func(ev []declaretest.Event) bool { return countKind(ev, "declare", 990) == 2 })
	assert.Equal(t, "https://opentelemetry.io/schemas/1.38.0", declaretest.LastDeclare(events, 990).GetProfilerResourceSchemaUrl())
}
