package gpumetricsexporter

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/exportertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"

	"github.com/gpumetrics/gpumetrics/collector/exporter/gpumetricsexporter/internal/metadata"
	"github.com/gpumetrics/gpumetrics/collector/internal/declaretest"
	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// testEnv is an exporter's settings with an observable logger and telemetry.
type testEnv struct {
	set       exporter.Settings
	logs      *observer.ObservedLogs
	telemetry *componenttest.Telemetry
}

func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := exportertest.NewNopSettings(metadata.Type)
	set.ID = component.MustNewIDWithName(metadata.Type.String(), "test")
	set.TelemetrySettings = tel.NewTelemetrySettings()
	set.Logger = zap.New(core)
	return &testEnv{set: set, logs: logs, telemetry: tel}
}

// metric returns the value of the internal telemetry metric name with the given attributes (the
// sum of all its points when attrs is empty); 0 when it was never recorded.
func (e *testEnv) metric(t testing.TB, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	m, err := e.telemetry.GetMetric(name)
	if err != nil {
		return 0
	}
	want := attribute.NewSet(attrs...)
	var points []metricdata.DataPoint[int64]
	switch data := m.Data.(type) {
	case metricdata.Sum[int64]:
		points = data.DataPoints
	case metricdata.Gauge[int64]:
		points = data.DataPoints
	default:
		t.Fatalf("%s is %T", name, m.Data)
	}
	var total int64
	for _, dp := range points {
		if len(attrs) == 0 || dp.Attributes.Equals(&want) {
			total += dp.Value
		}
	}
	return total
}

// fakeProc is a fake procfs root: <root>/<pid>/stat with a chosen start time (field 22).
type fakeProc struct {
	t    testing.TB
	root string
}

func newFakeProc(t testing.TB) *fakeProc {
	t.Helper()
	p := &fakeProc{t: t, root: t.TempDir()}
	p.set(1, 1) // init: the exporter checks at start that proc_root shows pids
	return p
}

// set writes pid's stat with the given start time (a restarted pid gets a new one).
func (p *fakeProc) set(pid uint32, start uint64) {
	p.t.Helper()
	dir := filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10))
	require.NoError(p.t, os.MkdirAll(dir, 0o755))
	stat := strconv.FormatUint(uint64(pid), 10) + " (python3.11) S 1 1 1 0 -1 4194304 100 0 0 0 5 3 0 0 20 0 1 0 " +
		strconv.FormatUint(start, 10) + " 12345678 300 18446744073709551615\n"
	require.NoError(p.t, os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644))
}

// setExe makes <root>/<pid>/exe a symlink to target (what readlink of /proc/<pid>/exe gives).
func (p *fakeProc) setExe(pid uint32, target string) {
	p.t.Helper()
	link := filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10), "exe")
	_ = os.Remove(link)
	require.NoError(p.t, os.Symlink(target, link))
}

// setBootTime writes <root>/stat with btime (seconds since the Unix epoch).
func (p *fakeProc) setBootTime(btime int64) {
	p.t.Helper()
	stat := "cpu  1 2 3 4\nbtime " + strconv.FormatInt(btime, 10) + "\nprocesses 9\n"
	require.NoError(p.t, os.WriteFile(filepath.Join(p.root, "stat"), []byte(stat), 0o644))
}

// remove deletes pid's directory (the process exited).
func (p *fakeProc) remove(pid uint32) {
	p.t.Helper()
	require.NoError(p.t, os.RemoveAll(filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10))))
}

// clock is a settable time source for the exporter.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// rig is a started exporter (its sweeper's ticker set far beyond any test: tests sweep by hand)
// on a recording sidecar, a fake procfs and a fake clock.
type rig struct {
	env   *testEnv
	srv   *declaretest.Server
	lis   *declaretest.Listener
	proc  *fakeProc
	clock *clock
	exp   *profilesExporter
	cfg   *Config
}

// newRig builds the rig; configure adjusts the configuration, serving says whether the
// recording sidecar listens from the start.
func newRig(t testing.TB, serving bool, configure func(*Config)) *rig {
	t.Helper()
	r := &rig{env: newTestEnv(t), srv: declaretest.New(), proc: newFakeProc(t), clock: &clock{now: time.Unix(1_800_000_000, 0)}}
	r.lis = declaretest.NewListener(t, r.srv)
	if serving {
		r.lis.Start()
	}
	cfg := createDefaultConfig().(*Config)
	cfg.Endpoint = r.lis.Endpoint
	cfg.ProcRoot = r.proc.root
	cfg.ExitCheckInterval = time.Hour
	cfg.ExpireAfter = 2 * time.Hour
	if configure != nil {
		configure(cfg)
	}
	require.NoError(t, cfg.Validate())
	r.cfg = cfg
	exp, err := newProfilesExporter(r.env.set, cfg)
	require.NoError(t, err)
	exp.now = r.clock.Now
	require.NoError(t, exp.start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), declaretest.WaitTimeout)
		defer cancel()
		require.NoError(t, exp.shutdown(ctx))
	})
	r.exp = exp
	if serving {
		// The first (empty) resynchronisation is answered: what a test consumes from here on
		// reaches the open stream as single changes.
		waitMetric(t, r.env, "otelcol_gpumetrics_exporter_resyncs", 1)
	}
	return r
}

// consume hands pd to the exporter as a pipeline would.
func (r *rig) consume(t *testing.T, pd pprofile.Profiles) {
	t.Helper()
	require.NoError(t, r.exp.consumeProfiles(context.Background(), pd))
}

// sweep runs one exit check now.
func (r *rig) sweep() { r.exp.sweep(r.exp.currentClient(), r.clock.Now()) }

// profilerProcess is one process as the eBPF profiler describes it on a resource
// (reporter/internal/pdata/generate.go setResourceAttributes): container.id when the cgroup
// names one, process.pid (int), process.executable.path and .name, and one
// process.environment_variable.<NAME> per configured name the process has.
type profilerProcess struct {
	pid         uint32
	exe         string
	containerID string
	env         map[string]string
}

// profiles builds one ExportProfilesServiceRequest's worth of data: a ResourceProfiles per
// process, each with one profile of one sample, as the profiler sends them.
func profiles(procs ...profilerProcess) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	for _, p := range procs {
		rp := pd.ResourceProfiles().AppendEmpty()
		rp.SetSchemaUrl("https://opentelemetry.io/schemas/1.37.0")
		attrs := rp.Resource().Attributes()
		if p.containerID != "" {
			attrs.PutStr("container.id", p.containerID)
		}
		attrs.PutInt("process.pid", int64(p.pid))
		attrs.PutStr("process.executable.path", p.exe)
		attrs.PutStr("process.executable.name", filepath.Base(p.exe))
		for k, v := range p.env {
			attrs.PutStr("process.environment_variable."+k, v)
		}
		sp := rp.ScopeProfiles().AppendEmpty()
		sp.Scope().SetName("go.opentelemetry.io/ebpf-profiler")
		sp.Profiles().AppendEmpty().Samples().AppendEmpty()
	}
	return pd
}

// recorded returns the real profiler's reports from testdata/ebpf-profiler (README.md there).
func recorded(t *testing.T) []pprofile.Profiles {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "ebpf-profiler", "profiles.jsonl"))
	require.NoError(t, err)
	var out []pprofile.Profiles
	for _, line := range splitLines(b) {
		pd, err := (&pprofile.JSONUnmarshaler{}).UnmarshalProfiles(line)
		require.NoError(t, err)
		out = append(out, pd)
	}
	require.Len(t, out, 2)
	return out
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	start := 0
	for i, c := range b {
		if c == '\n' {
			if i > start {
				out = append(out, b[start:i])
			}
			start = i + 1
		}
	}
	if start < len(b) {
		out = append(out, b[start:])
	}
	return out
}

// declaredAttrs decodes a declaration's profiler_resource into the raw form pcommon.Map.AsRaw
// gives, to compare with the resource the profile carried.
func declaredAttrs(t *testing.T, d *gpumetricsv1.ProcessDeclaration) map[string]any {
	t.Helper()
	var r resourcepb.Resource
	require.NoError(t, proto.Unmarshal(d.GetProfilerResource(), &r))
	m := pcommon.NewMap()
	for _, kv := range r.GetAttributes() {
		putAny(m, kv.GetKey(), kv.GetValue())
	}
	return m.AsRaw()
}

func putAny(m pcommon.Map, k string, v *commonpb.AnyValue) {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		m.PutStr(k, x.StringValue)
	case *commonpb.AnyValue_IntValue:
		m.PutInt(k, x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		m.PutDouble(k, x.DoubleValue)
	case *commonpb.AnyValue_BoolValue:
		m.PutBool(k, x.BoolValue)
	default:
		panic("unexpected value type in a profiler resource")
	}
}

// countKind counts events of kind for pid (0: any pid).
func countKind(events []declaretest.Event, kind string, pid uint32) int {
	n := 0
	for _, e := range events {
		if e.Kind() != kind {
			continue
		}
		p := e.Request.GetDeclare().GetPid()
		if kind == "exit" {
			p = e.Request.GetExit().GetPid()
		}
		if pid == 0 || p == pid {
			n++
		}
	}
	return n
}
