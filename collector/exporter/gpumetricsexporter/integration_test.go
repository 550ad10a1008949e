//go:build integration

// Integration tests against the real sidecar: `gpumetrics serve --simulate` on a simulated node
// whose GPU processes are real children of this test, so the start times the exporter reads
// from /proc are the ones the sidecar checks. Run by collector/scripts/test.sh with
// SIDECAR_COMMAND set to the project's `gpumetrics` console script:
//
//	SIDECAR_COMMAND=$PWD/../.venv/bin/gpumetrics go test -tags integration -run Integration ./exporter/gpumetricsexporter/
package gpumetricsexporter

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// integrationTimeout bounds every wait on the real sidecar (its start imports grpcio and the
// simulated driver: seconds on a loaded 2-core machine).
const integrationTimeout = 90 * time.Second

// sidecarCommand is the `gpumetrics` console script: $SIDECAR_COMMAND, else the repository's
// .venv. These tests were asked for (-tags integration): without a sidecar they fail.
func sidecarCommand(t testing.TB) string {
	t.Helper()
	if c := os.Getenv("SIDECAR_COMMAND"); c != "" {
		return c
	}
	venv, err := filepath.Abs(filepath.Join("..", "..", "..", ".venv", "bin", "gpumetrics"))
	require.NoError(t, err)
	if _, err := os.Stat(venv); err != nil {
		t.Fatalf("no gpumetrics sidecar: set SIDECAR_COMMAND or create the repository's .venv (%v)", err)
	}
	return venv
}

// child starts a real process that stands for a GPU process and stops it at the end of the test.
func child(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.Env = append(os.Environ(), env...)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// writeScenario writes a simulated node with one L4 running pids.
func writeScenario(t testing.TB, pids ...int) string {
	t.Helper()
	var procs []string
	for i, pid := range pids {
		procs = append(procs, fmt.Sprintf("      - {pid: %d, used_memory_bytes: %d, utilization: {sm: 30, mem: 10}}", pid, (i+1)<<30))
	}
	scenario := `format: 1
name: exporter-integration
devices:
  - uuid: GPU-e2e00000-0000-4000-8000-0000000000aa
    name: NVIDIA L4
    memory: {total_bytes: 24152899584, used_bytes: 4294967296}
    utilization: {gpu: 50, memory: 10}
    process_utilization: {}
    processes:
` + strings.Join(procs, "\n") + "\n"
	path := filepath.Join(t.TempDir(), "scenario.yaml")
	require.NoError(t, os.WriteFile(path, []byte(scenario), 0o644))
	return path
}

// profilerSocket is where the sidecar of the pull socket `socket` serves the profiler service
// (its own unix socket, as the sidecar's default; the exporter declares there).
func profilerSocket(socket string) string {
	return strings.TrimSuffix(socket, ".sock") + "-profiler.sock"
}

// sidecar is a running `gpumetrics serve --simulate` on a unix socket.
type sidecar struct {
	cmd *exec.Cmd
	log string
}

func startSidecar(t testing.TB, scenario, socket string) *sidecar {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "sidecar.log")
	log, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(sidecarCommand(t), "serve", "--simulate", scenario, "--listen", "unix:"+socket,
		"--profiler-listen", "unix:"+profilerSocket(socket), "--batch-interval", "1", "--node-name", "exporter-it")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUMETRICS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(t, cmd.Start())
	s := &sidecar{cmd: cmd, log: logPath}
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop sends SIGTERM and waits (at most integrationTimeout); no-op when already stopped.
func (s *sidecar) stop(t testing.TB) {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("sidecar exited: %v\n%s", err, s.tail())
		}
	case <-time.After(integrationTimeout):
		_ = s.cmd.Process.Kill()
		<-done
		t.Errorf("sidecar did not stop within %s", integrationTimeout)
	}
}

func (s *sidecar) tail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// puller reads the sidecar's per-process resources through MetricsPullService, as the
// gpumetrics receiver does, acknowledging what it read.
type puller struct {
	pull gpumetricsv1.MetricsPullServiceClient
	ack  uint64
	ep   string
	// schemaURL is the schema_url of the ResourceMetrics resource last returned.
	schemaURL string
}

func newPuller(t *testing.T, socket string) *puller {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &puller{pull: gpumetricsv1.NewMetricsPullServiceClient(conn)}
}

// resource returns the latest per-process resource of pid the sidecar produced since the last
// call (nil when none yet).
func (p *puller) resource(t *testing.T, pid int) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := p.pull.Pull(ctx, &gpumetricsv1.PullRequest{Consumer: "exporter-it", AckSequence: p.ack, AckEpoch: p.ep})
	if err != nil {
		return nil // starting, restarting, or nothing stored yet
	}
	if resp.GetEpoch() != p.ep {
		p.ep, p.ack = resp.GetEpoch(), 0
	}
	if resp.GetLastSequence() != 0 {
		p.ack = resp.GetLastSequence()
	}
	req := pmetricotlp.NewExportRequest()
	require.NoError(t, req.UnmarshalProto(resp.GetExportMetricsServiceRequest()))
	var found map[string]any
	rms := req.Metrics().ResourceMetrics()
	for i := range rms.Len() {
		attrs := rms.At(i).Resource().Attributes()
		if v, ok := attrs.Get("process.pid"); ok && v.Type() == pcommon.ValueTypeInt && v.Int() == int64(pid) {
			found = attrs.AsRaw()
			p.schemaURL = rms.At(i).SchemaUrl()
		}
	}
	return found
}

// waitResource pulls until pid's resource satisfies cond, and returns it.
func (p *puller) waitResource(t *testing.T, s *sidecar, pid int, what string, cond func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(integrationTimeout)
	var last map[string]any
	for time.Now().Before(deadline) {
		if r := p.resource(t, pid); r != nil {
			last = r
			if cond(r) {
				return r
			}
		}
		time.Sleep(200 * time.Millisecond) // polling interval inside the deadline (batches are 1 s)
	}
	t.Fatalf("timed out after %s waiting for pid %d's GPU resource: %s; last: %v\n%s", integrationTimeout, pid, what, last, s.tail())
	return nil
}

// profileOf is the profile resource the eBPF profiler gives the real process pid
// (process.pid, process.executable.*, the configured environment variables), plus attrs.
func profileOf(t *testing.T, pid int, env map[string]string, extra map[string]string) pprofile.Profiles {
	t.Helper()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	require.NoError(t, err)
	pd := profiles(profilerProcess{pid: uint32(pid), exe: exe, env: env})
	attrs := pd.ResourceProfiles().At(0).Resource().Attributes()
	for k, v := range extra {
		attrs.PutStr(k, v)
	}
	return pd
}

// contains reports whether got holds every attribute of want with the same value and type.
func contains(got, want map[string]any) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// TestIntegrationRealSidecar drives the exporter against the real sidecar through a whole life:
// the sidecar is down when the exporter starts; it comes up and the profiled process's GPU
// resource gets the declared profile resource; a changed resource is declared again; the
// sidecar restarts and the exporter's resync declares it afresh; the process exits and the
// exporter's exit releases the declaration.
func TestIntegrationRealSidecar(t *testing.T) {
	profiled := child(t, "OTEL_SERVICE_NAME=gpu-trainer")
	other := child(t)
	pid := profiled.Process.Pid
	scenario := writeScenario(t, pid, other.Process.Pid)
	socket := filepath.Join(t.TempDir(), "gm.sock")

	env := newTestEnv(t)
	cfg := createDefaultConfig().(*Config)
	cfg.Endpoint = "unix://" + profilerSocket(socket)
	cfg.ExitCheckInterval = time.Hour // swept by hand below
	cfg.ExpireAfter = 2 * time.Hour
	require.NoError(t, cfg.Validate())
	exp, err := newProfilesExporter(env.set, cfg)
	require.NoError(t, err)
	require.NoError(t, exp.start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, exp.shutdown(context.Background())) })

	// 1. The sidecar is down: the profile is held.
	container := "c65dedadcb5294cd8b41e7ae6da375613837b0ca7c004ca7be621733b8e1e30b"
	pd := profileOf(t, pid, map[string]string{"OTEL_SERVICE_NAME": "gpu-trainer"}, map[string]string{"container.id": container})
	require.NoError(t, exp.consumeProfiles(context.Background(), pd))
	want := pd.ResourceProfiles().At(0).Resource().Attributes().AsRaw()

	sc := startSidecar(t, scenario, socket)
	p := newPuller(t, socket)
	got := p.waitResource(t, sc, pid, "the declared profile resource", func(r map[string]any) bool { return contains(r, want) })
	t.Logf("GPU resource of the declared process: %v", got)
	t.Logf("its profile resource:                 %v", want)

	// 2. The profile resource changes: declared again.
	pd = profileOf(t, pid, map[string]string{"OTEL_SERVICE_NAME": "gpu-trainer-v2"}, map[string]string{"container.id": container})
	require.NoError(t, exp.consumeProfiles(context.Background(), pd))
	want = pd.ResourceProfiles().At(0).Resource().Attributes().AsRaw()
	p.waitResource(t, sc, pid, "the changed profile resource", func(r map[string]any) bool { return contains(r, want) })

	// 3. The sidecar restarts (its declared store starts empty): the exporter's resync after it
	// reconnects declares the process again.
	sc.stop(t)
	sc = startSidecar(t, scenario, socket)
	p.waitResource(t, sc, pid, "the profile resource after the sidecar restarted", func(r map[string]any) bool { return contains(r, want) })
	assert.GreaterOrEqual(t, env.metric(t, "otelcol_gpumetrics_exporter_resyncs"), int64(2))

	// 4. The process exits: the sweep sees its pid gone and releases it; the declared
	// container.id (the child is in no container) is no longer on its GPU resource.
	require.NoError(t, profiled.Process.Kill())
	_, _ = profiled.Process.Wait()
	exp.sweep(exp.currentClient(), time.Now())
	p.waitResource(t, sc, pid, "no declared container.id after the exit", func(r map[string]any) bool { return r["container.id"] == nil })
	assert.Equal(t, int64(1), env.metric(t, "otelcol_gpumetrics_exporter_processes_exited"))
	assert.Zero(t, env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed"), "the real sidecar accepted every declaration")
}

// TestIntegrationNotUTF8AndSchemaURL (issue 27 items 2 and 5): a profile resource whose
// environment value is raw Latin-1 (as the eBPF profiler sends what /proc shows) reaches the real
// sidecar's GPU resource with the bytes replaced by U+FFFD, and the ResourceProfiles' schema_url
// is the ResourceMetrics' schema_url.
func TestIntegrationNotUTF8AndSchemaURL(t *testing.T) {
	profiled := child(t)
	pid := profiled.Process.Pid
	scenario := writeScenario(t, pid)
	socket := filepath.Join(t.TempDir(), "gm.sock")
	sc := startSidecar(t, scenario, socket)

	env := newTestEnv(t)
	cfg := createDefaultConfig().(*Config)
	cfg.Endpoint = "unix://" + profilerSocket(socket)
	require.NoError(t, cfg.Validate())
	exp, err := newProfilesExporter(env.set, cfg)
	require.NoError(t, err)
	require.NoError(t, exp.start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, exp.shutdown(context.Background())) })

	pd := profileOf(t, pid, map[string]string{"LANG_NAME": "caf\xe9"}, nil)
	pd.ResourceProfiles().At(0).SetSchemaUrl("https://opentelemetry.io/schemas/1.37.0")
	require.NoError(t, exp.consumeProfiles(context.Background(), pd))
	p := newPuller(t, socket)
	got := p.waitResource(t, sc, pid, "the declared resource, not UTF-8 replaced", func(r map[string]any) bool {
		return r["process.environment_variable.LANG_NAME"] == "caf\uFFFD"
	})
	want := pd.ResourceProfiles().At(0).Resource().Attributes().AsRaw()
	want["process.environment_variable.LANG_NAME"] = "caf\uFFFD"
	assert.Equal(t, want, got)
	assert.Equal(t, "https://opentelemetry.io/schemas/1.37.0", p.schemaURL)
	assert.Equal(t, int64(1), env.metric(t, "otelcol_gpumetrics_exporter_declarations_failed", attribute.String("reason", "invalid_utf8")))
}

// BenchmarkIntegrationRealSidecar10k: 10,000 new processes in one report, until the real
// sidecar accepted every declaration (its declared store validates and holds each one); the
// figure is declarations per second through the Python servicer. Run with
//
//	go test -tags integration -run XXX -bench IntegrationRealSidecar -benchtime 3x ./exporter/gpumetricsexporter/
func BenchmarkIntegrationRealSidecar10k(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		r := newRig(b, false, func(c *Config) { c.MaxProcesses = 2 * benchProcesses })
		for i := range benchProcesses {
			r.proc.set(uint32(100_000+i), uint64(1000+i))
		}
		socket := filepath.Join(b.TempDir(), "gm.sock")
		// The rig's recording listener is not started; point a fresh exporter at the sidecar.
		cfg := *r.cfg
		cfg.Endpoint = "unix://" + profilerSocket(socket)
		exp, err := newProfilesExporter(r.env.set, &cfg)
		require.NoError(b, err)
		require.NoError(b, exp.start(context.Background(), componenttest.NewNopHost()))
		sc := startSidecar(b, writeScenario(b, os.Getpid()), socket)
		deadline := time.Now().Add(integrationTimeout)
		for exp.currentClient().Stats().Resyncs == 0 {
			require.True(b, time.Now().Before(deadline), "no resync: %s", sc.tail())
			time.Sleep(10 * time.Millisecond)
		}
		pd := benchBatch(benchProcesses, 0)
		b.StartTimer()
		start := time.Now()
		require.NoError(b, exp.consumeProfiles(context.Background(), pd))
		for exp.currentClient().Stats().Declared < benchProcesses {
			require.True(b, time.Now().Before(deadline.Add(integrationTimeout)), "declared %d: %s", exp.currentClient().Stats().Declared, sc.tail())
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(benchProcesses)/elapsed.Seconds(), "declarations/s")
		require.Zero(b, exp.currentClient().Stats().Rejected)
		require.NoError(b, exp.shutdown(context.Background()))
		sc.stop(b)
		b.StartTimer()
	}
}
