package conformance

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

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// startTimeout bounds the wait for a sidecar to serve (it imports grpcio and the simulated driver:
// about a second, more on a loaded 2-core machine) and for it to stop.
const startTimeout = 90 * time.Second

// scenario is the simulated node of the real runner: one GPU, no process on it, no event, so
// the metric store gets one batch per collection and the log store none.
const scenario = `format: 1
name: conformance
devices:
  - uuid: GPU-c0f00000-0000-4000-8000-000000000001
    name: NVIDIA L4
    memory: {total_bytes: 24152899584, used_bytes: 4294967296}
    utilization: {gpu: 50, memory: 10}
`

// TestRealSidecar runs every case without a controlled step against `gpumetrics serve
// --simulate`, a fresh process per case, configured with the case's `config` (--config) and a
// one-hour batch interval: it serves once its first collection is stored (sequence 1, the
// cases' `given: first_collection`) and stores no other while the case runs.
func TestRealSidecar(t *testing.T) {
	command := SidecarCommand(t)
	RunAll(t, []string{"pull", "logs", "profiler"}, func(c Case) bool { return !c.Controlled() },
		func(t *testing.T, c Case) Target {
			if c.Service == "pull" && c.Given != "first_collection" {
				t.Fatalf("%s: the real sidecar's metric store is never empty: a pull case it runs needs given: first_collection", c.ID())
			}
			return startReal(t, command, c)
		})
}

// realSidecar is one `gpumetrics serve --simulate` process (restarted in place by Restart).
type realSidecar struct {
	command, dir, config string
	lives                int
	cmd                  *exec.Cmd
	exited               chan error
	log                  string
	conn                 *grpc.ClientConn
}

func startReal(t *testing.T, command string, c Case) *realSidecar {
	t.Helper()
	dir, err := os.MkdirTemp("", "gmc-") // short: a unix socket path has at most 107 bytes
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "scenario.yaml"), []byte(scenario), 0o600))
	cfg, err := yaml.Marshal(withProfilerOnListen(c.Config))
	require.NoError(t, err)
	s := &realSidecar{command: command, dir: dir, config: filepath.Join(dir, "config.yaml")}
	require.NoError(t, os.WriteFile(s.config, cfg, 0o600))
	s.start(t)
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *realSidecar) Conn() grpc.ClientConnInterface { return s.conn }

func (s *realSidecar) Restart(t testing.TB) {
	s.stop(t)
	s.start(t)
}

func (s *realSidecar) start(t testing.TB) {
	t.Helper()
	s.lives++
	socket := filepath.Join(s.dir, fmt.Sprintf("life-%d.sock", s.lives))
	s.log = filepath.Join(s.dir, fmt.Sprintf("life-%d.log", s.lives))
	log, err := os.Create(s.log)
	require.NoError(t, err)
	defer log.Close()
	s.cmd = exec.Command(s.command, "serve", "--simulate", filepath.Join(s.dir, "scenario.yaml"),
		"--config", s.config, "--listen", "unix:"+socket, "--batch-interval", "3600",
		"--node-name", "conformance")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUMETRICS_") {
			s.cmd.Env = append(s.cmd.Env, kv)
		}
	}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	require.NoError(t, s.cmd.Start())
	s.exited = make(chan error, 1)
	go func(cmd *exec.Cmd, exited chan<- error) { exited <- cmd.Wait() }(s.cmd, s.exited)
	s.conn, err = grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	s.waitServing(t)
}

// waitServing watches the sidecar's health until it is SERVING (its first collection is
// stored), failing the test if the process exits first or startTimeout passes.
func (s *realSidecar) waitServing(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	serving := make(chan error, 1)
	go func() {
		w, err := healthpb.NewHealthClient(s.conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		for err == nil {
			var r *healthpb.HealthCheckResponse
			if r, err = w.Recv(); err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
		}
		serving <- err
	}()
	select {
	case err := <-serving:
		require.NoError(t, err, "waiting for the sidecar to serve\n%s", s.tail())
	case err := <-s.exited:
		s.exited <- err
		t.Fatalf("the sidecar exited before serving (%v)\n%s", err, s.tail())
	}
}

// stop closes the connection, sends SIGTERM and waits (at most startTimeout).
func (s *realSidecar) stop(t testing.TB) {
	t.Helper()
	if s.cmd == nil {
		return
	}
	_ = s.conn.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.exited:
		if err != nil {
			t.Errorf("the sidecar exited with %v\n%s", err, s.tail())
		}
	case <-time.After(startTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		t.Errorf("the sidecar did not stop within %s\n%s", startTimeout, s.tail())
	}
	s.cmd = nil
}

func (s *realSidecar) tail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// withProfilerOnListen returns a case's configuration with server.profiler_listen empty: every
// service on the one socket the runner dials (the sidecar's default puts the profiler service on
// a socket of its own; a unix socket checks the peer's credentials, and the test runs as the
// sidecar's own user, a trusted declarer).
func withProfilerOnListen(config map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range config {
		out[k] = v
	}
	server := map[string]any{}
	if given, ok := config["server"].(map[string]any); ok {
		for k, v := range given {
			server[k] = v
		}
	}
	server["profiler_listen"] = []any{}
	out["server"] = server
	return out
}
