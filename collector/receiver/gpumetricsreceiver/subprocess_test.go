package gpumetricsreceiver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpumetrics/gpumetrics/collector/internal/conformance"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

// pluginPath is the test plugin built from testdata/testplugin, once per test binary.
var pluginPath = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "gpumetrics-testplugin-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "testplugin")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", out, "./testdata/testplugin")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the test plugin: %w\n%s", err, b)
	}
	return out, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if path, err := pluginPath(); err == nil {
		_ = os.RemoveAll(filepath.Dir(path))
	}
	os.Exit(code)
}

func subprocessConfig(t *testing.T) *Config {
	t.Helper()
	path, err := pluginPath()
	require.NoError(t, err)
	cfg := createDefaultConfig().(*Config)
	cfg.Command = path
	cfg.InitialDelay = 0
	cfg.Env = map[string]string{"TESTPLUGIN_BATCHES": "3"}
	return cfg
}

// pluginPids returns the process.pid resource attribute of every resource accepted.
func (c *scriptedConsumer) pluginPids() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int64
	for _, md := range c.accepted {
		for i := range md.ResourceMetrics().Len() {
			v, _ := md.ResourceMetrics().At(i).Resource().Attributes().Get("process.pid")
			out = append(out, v.Int())
		}
	}
	return out
}

func TestSubprocessHandshakePullAndCleanShutdown(t *testing.T) {
	env := newTestEnv(t)
	cfg := subprocessConfig(t)
	s, err := newPullScraper(env.set, cfg)
	require.NoError(t, err)
	require.NoError(t, s.start(context.Background(), componenttest.NewNopHost()))

	p, ok := s.conn.(*sidecar.Plugin)
	require.True(t, ok, "subprocess mode connects through go-plugin")
	pid := p.Pid()
	require.Positive(t, pid)

	next := newScriptedConsumer()
	scrapeErr, consumeErr := cycle(s, next)
	require.NoError(t, scrapeErr)
	require.NoError(t, consumeErr)
	assert.Equal(t, []string{"b1", "b2", "b3"}, next.batchLabels(), "pulled until more == false (2 + 1 batches)")
	assert.Equal(t, []int64{int64(pid), int64(pid), int64(pid)}, next.pluginPids())

	require.NoError(t, s.shutdown(context.Background()))

	// the sidecar's stderr line reached the Collector's log, at its own level
	stderr := env.logs.FilterMessageSnippet("testplugin serving")
	require.Equal(t, 1, stderr.Len())
	assert.Equal(t, zapcore.InfoLevel, stderr.All()[0].Level)
	// go-plugin's handshake and a graceful exit (Shutdown answered, no SIGKILL)
	assert.Equal(t, 1, env.logs.FilterMessage("Started the gpumetrics sidecar as a go-plugin subprocess").Len())
	assert.Equal(t, 1, env.logs.FilterMessage("plugin exited").Len(), "go-plugin logs this only after a graceful exit")
	assert.Zero(t, env.logs.FilterMessageSnippet("failed to exit gracefully").Len())
	assert.Zero(t, env.logs.FilterMessageSnippet("killing it").Len())
	assert.ErrorIs(t, unix.Kill(pid, 0), unix.ESRCH, "the plugin process is gone")
}

// waitExit blocks until process pid has terminated (its pidfd becomes readable).
func waitExit(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		require.ErrorIs(t, err, unix.ESRCH)
		return
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}} //nolint:gosec // fd fits
	for {
		n, err := unix.Poll(fds, 30_000)
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		require.Equal(t, 1, n, "plugin %d did not exit within 30 s", pid)
		return
	}
}

func TestSubprocessRestartsALostSidecar(t *testing.T) {
	env := newTestEnv(t)
	s := newScraper(t, env, subprocessConfig(t))
	clock := useFakeClock(s, time.Now())
	next := newScriptedConsumer()
	_, _ = cycle(s, next)
	first := next.pluginPids()
	require.Len(t, first, 3)

	require.NoError(t, unix.Kill(int(first[0]), unix.SIGKILL))
	waitExit(t, int(first[0]))

	scrapeErr, _ := cycle(s, next)
	require.ErrorContains(t, scrapeErr, "pull from the gpumetrics sidecar: ")
	assert.Equal(t, codes.Unavailable, status.Code(errors.Unwrap(scrapeErr)), "scrape error: %v", scrapeErr)
	assert.Empty(t, clock.recorded(), "a dead subprocess is dropped, not retried")
	assert.Equal(t, 1, env.logs.FilterMessageSnippet("sidecar process is gone").Len())

	scrapeErr, consumeErr := cycle(s, next)
	require.NoError(t, scrapeErr)
	require.NoError(t, consumeErr)
	pids := next.pluginPids()
	require.Len(t, pids, 6, "the new sidecar's three batches")
	assert.NotEqual(t, first[0], pids[3])
	assert.Equal(t, 1, env.logs.FilterMessageSnippet("sidecar restarted").Len(), "new epoch detected")
}

// TestSubprocessRetriesAStartingSidecar: a live plugin answers UNAVAILABLE to its first three
// Pulls (no collection stored yet); the scrape retries (the process is checked before each
// retry and is there) and delivers the batches, keeping the same process.
func TestSubprocessRetriesAStartingSidecar(t *testing.T) {
	env := newTestEnv(t)
	cfg := subprocessConfig(t)
	cfg.Env["TESTPLUGIN_UNAVAILABLE_PULLS"] = "3"
	s := newScraper(t, env, cfg)
	clock := useFakeClock(s, time.Now())
	conn := s.conn
	next := newScriptedConsumer()

	scrapeErr, consumeErr := cycle(s, next)
	require.NoError(t, scrapeErr)
	require.NoError(t, consumeErr)
	assert.Equal(t, []string{"b1", "b2", "b3"}, next.batchLabels())
	assert.Equal(t, ms(100, 200, 400), clock.recorded())
	assert.Same(t, conn, s.conn, "the starting sidecar was kept")
	assert.Zero(t, env.logs.FilterMessageSnippet("sidecar process is gone").Len())
}

func TestSubprocessStartFailures(t *testing.T) {
	tests := []struct {
		name    string
		command string
		wantErr string
	}{
		{name: "not found", command: "gpumetrics-does-not-exist", wantErr: `sidecar command "gpumetrics-does-not-exist": exec: "gpumetrics-does-not-exist": executable file not found in $PATH`},
		{name: "not a plugin", command: "true", wantErr: `starting sidecar "true": it exited with status 0 before the go-plugin handshake and wrote nothing to stderr; is "true" the gpumetrics sidecar (` + "`gpumetrics serve`" + `)?`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := createDefaultConfig().(*Config)
			cfg.Command = tt.command
			require.NoError(t, cfg.Validate())
			s, err := newPullScraper(newTestEnv(t).set, cfg)
			require.NoError(t, err)
			err = s.start(context.Background(), componenttest.NewNopHost())
			require.ErrorContains(t, err, tt.wantErr)
			require.NoError(t, s.shutdown(context.Background()))
		})
	}
}

// realSidecar returns the gpumetrics console script (conformance.SidecarCommand: $SIDECAR_COMMAND,
// else the repository's .venv; skipped only when neither exists).
func realSidecar(t *testing.T) string { return conformance.SidecarCommand(t) }

// TestRealSidecarConfigErrorsReachTheStartError starts the Python sidecar through the real
// go-plugin host with a configuration it refuses: it must exit with status 2 before any
// handshake, and the receiver's start error and the Collector's log must carry its own message,
// not go-plugin's "Unrecognized remote plugin message" or a kill.
func TestRealSidecarConfigErrorsReachTheStartError(t *testing.T) {
	sidecarPath := realSidecar(t)
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{
			name: "bad profile in args",
			args: []string{"serve", "--plugin", "--simulate", "h100-8x"},
			want: "gpumetrics: 'runtime.simulate' (from flag --simulate): h100-8x: no such profile, field case or file; built-in profiles: ",
		},
		{
			name: "bad variable in env",
			args: []string{"serve", "--plugin", "--simulate"},
			env:  map[string]string{"GPUMETRICS_BATCH_INTERVAL_S": "soon"},
			want: "gpumetrics: 'runtime.batch_interval_s' (from GPUMETRICS_BATCH_INTERVAL_S='soon'): Input should be a valid number",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t)
			cfg := createDefaultConfig().(*Config)
			cfg.Command = sidecarPath
			cfg.Args = tt.args
			cfg.Env = tt.env
			require.NoError(t, cfg.Validate())
			s, err := newPullScraper(env.set, cfg)
			require.NoError(t, err)
			err = s.start(context.Background(), componenttest.NewNopHost())
			require.Error(t, err)
			var startErr *sidecar.StartError
			require.ErrorAs(t, err, &startErr)
			require.NotNil(t, startErr.State, "the sidecar ended by itself: %v", err)
			assert.True(t, startErr.State.Exited(), "exited, not killed: %s", startErr.State)
			assert.Equal(t, 2, startErr.State.ExitCode(), "a configuration error")
			assert.Contains(t, err.Error(), fmt.Sprintf("starting sidecar %q: it exited with status 2 before the go-plugin handshake; its stderr ended with: ", sidecarPath))
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "Unrecognized remote plugin message")
			assert.NotContains(t, err.Error(), "compiled for this architecture")

			// the Collector's log: the sidecar's line at ERROR (it writes "[ERROR] ..." in
			// go-plugin mode), under the sidecar's logger; no kill after the failed start
			logged := env.logs.FilterMessageSnippet(tt.want).FilterLevelExact(zapcore.ErrorLevel)
			require.Equal(t, 1, logged.Len(), "the sidecar's error line in the Collector log")
			assert.Equal(t, "sidecar."+filepath.Base(sidecarPath), logged.All()[0].LoggerName)
			assert.Zero(t, env.logs.FilterMessageSnippet("failed to exit gracefully").Len())
			require.NoError(t, s.shutdown(context.Background()))
		})
	}
}

func TestMergeEnvOverridesHost(t *testing.T) {
	got := sidecar.MergeEnv([]string{"A=1", "B=2", "PYTHONUNBUFFERED=0"}, map[string]string{"PYTHONUNBUFFERED": "1", "C": "3"})
	assert.ElementsMatch(t, []string{"A=1", "B=2", "PYTHONUNBUFFERED=1", "C=3"}, got)
}
