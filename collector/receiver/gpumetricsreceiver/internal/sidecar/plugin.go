package sidecar

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/hclogzap"
)

// healthService is the health-check service name every go-plugin plugin reports SERVING under.
const healthService = "plugin"

const (
	// exitWait bounds the wait for the sidecar to end after go-plugin failed to start it (go-plugin
	// has already SIGKILLed it then), so that its exit status and last stderr lines are known.
	exitWait = 5 * time.Second
	// exitPoll is how often go-plugin's Client.Exited is checked meanwhile (go-plugin offers no
	// exit notification).
	exitPoll = 10 * time.Millisecond
)

// StartError is returned by StartPlugin when the sidecar could not be started. Its message
// quotes the sidecar's last stderr lines and, when the process ended during the start, how it
// ended: a sidecar refusing its configuration exits with status 2 and says why on stderr before
// any handshake, which go-plugin alone reports as "Unrecognized remote plugin message" with notes
// about the plugin's architecture.
type StartError struct {
	// Command is the configured command.
	Command string
	// Err is what go-plugin, the dispense or the health check reported.
	Err error
	// State is how the process ended, when it ended by itself during the start; nil otherwise.
	State *os.ProcessState
	// Stderr holds the sidecar's last stderr lines (at most 5), oldest first, without hclog
	// JSON or level prefixes.
	Stderr []string
}

func (e *StartError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "starting sidecar %q: ", e.Command)
	switch {
	case e.State != nil && e.State.Exited():
		fmt.Fprintf(&b, "it exited with status %d before the go-plugin handshake", e.State.ExitCode())
		if len(e.Stderr) == 0 {
			b.WriteString(" and wrote nothing to stderr")
			if e.State.ExitCode() == 0 {
				fmt.Fprintf(&b, "; is %q the gpumetrics sidecar (`gpumetrics serve`)?", e.Command)
			}
		}
	case e.State != nil:
		fmt.Fprintf(&b, "%v; the sidecar ended (%s)", e.Err, e.State)
	default:
		fmt.Fprintf(&b, "%v", e.Err)
	}
	if len(e.Stderr) > 0 {
		b.WriteString("; its stderr ended with: ")
		b.WriteString(strings.Join(e.Stderr, " | "))
	}
	return b.String()
}

// Unwrap returns Err.
func (e *StartError) Unwrap() error { return e.Err }

// PluginConfig says how to start the sidecar as a go-plugin subprocess.
type PluginConfig struct {
	// Command is the executable (a path, or a name looked up in PATH). It is executed directly,
	// never through a shell, so that stopping it stops the sidecar itself.
	Command string
	// Args are the command-line arguments after Command.
	Args []string
	// Env is added to the Collector's own environment; a key here overrides the Collector's
	// value (go-plugin alone would let the Collector's value win). go-plugin's own variables
	// (the magic cookie, PLUGIN_*) are added last and cannot be overridden.
	Env map[string]string
	// StartTimeout bounds the time from exec to the handshake line on the sidecar's stdout.
	StartTimeout time.Duration
	// Logger receives go-plugin's messages and the sidecar's stderr lines.
	Logger *zap.Logger
}

// Plugin is a sidecar started as a go-plugin subprocess. A go-plugin Client cannot be started
// twice: after the process has gone, Close this Plugin and call StartPlugin again.
type Plugin struct {
	client *plugin.Client
	cmd    *exec.Cmd
	pull   gpumetricsv1.MetricsPullServiceClient
	logs   gpumetricsv1.LogsPullServiceClient
	health healthpb.HealthClient
	logger *zap.Logger

	closeOnce sync.Once
}

var _ Conn = (*Plugin)(nil)

// MergeEnv returns base with every key of extra set to extra's value (later keys replace earlier
// ones, and each key appears once). base is in os.Environ form ("KEY=value").
func MergeEnv(base []string, extra map[string]string) []string {
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		key, _, _ := strings.Cut(kv, "=")
		if _, replaced := extra[key]; !replaced {
			out = append(out, kv)
		}
	}
	for key, value := range extra {
		out = append(out, key+"="+value)
	}
	return out
}

// StartPlugin starts the sidecar, waits for its handshake (at most cfg.StartTimeout), dispenses
// the pull client and checks that the sidecar answers grpc.health.v1 for "plugin". On any
// failure the process is stopped and the error, a *StartError, says which step failed, how the
// process ended and what it last wrote to stderr.
func StartPlugin(ctx context.Context, cfg PluginConfig) (*Plugin, error) {
	path, err := exec.LookPath(cfg.Command)
	if err != nil {
		return nil, fmt.Errorf("sidecar command %q: %w", cfg.Command, err)
	}
	cmd := exec.Command(path, cfg.Args...)
	cmd.Env = MergeEnv(os.Environ(), cfg.Env)
	tail := &stderrTail{}

	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:     Handshake,
		Plugins:             plugin.PluginSet{PluginName: &PullPlugin{}},
		Cmd:                 cmd,
		SkipHostEnv:         true, // cmd.Env already holds the host environment, merged above
		AllowedProtocols:    []plugin.Protocol{plugin.ProtocolGRPC},
		GRPCBrokerMultiplex: false,
		AutoMTLS:            false,
		StartTimeout:        cfg.StartTimeout,
		Logger:              hclogzap.New(cfg.Logger),
		Stderr:              tail,
	})
	p := &Plugin{client: client, cmd: cmd, logger: cfg.Logger}
	rpc, err := client.Client() // starts the process and reads the handshake
	if err != nil {
		// go-plugin has stopped the process (SIGKILL) unless it had ended by itself; once it has
		// ended, its exit state and last stderr lines are known and there is nothing to kill.
		state := p.waitExit(ctx, exitWait)
		if state == nil {
			_ = p.Close(ctx)
		}
		if state != nil && state.Exited() {
			p.logger.Debug("go-plugin's start error, replaced by the sidecar's own", zap.Error(err))
		}
		return nil, &StartError{Command: cfg.Command, Err: err, State: state, Stderr: tail.Lines()}
	}
	if err := p.connect(ctx, rpc); err != nil {
		var state *os.ProcessState
		if client.Exited() {
			state = cmd.ProcessState // set before Exited turns true (go-plugin's wait goroutine)
		}
		_ = p.Close(ctx)
		return nil, &StartError{Command: cfg.Command, Err: err, State: state, Stderr: tail.Lines()}
	}
	return p, nil
}

// waitExit waits up to wait (or until ctx ends) for go-plugin to see the process end, and returns
// its exit state; nil when the process never started or has not ended in time.
func (p *Plugin) waitExit(ctx context.Context, wait time.Duration) *os.ProcessState {
	if p.cmd.Process == nil {
		return nil // exec failed: there is no process
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(exitPoll)
	defer tick.Stop()
	for !p.client.Exited() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	// go-plugin sets Exited under its lock after cmd.Wait returned, so ProcessState is set.
	return p.cmd.ProcessState
}

func (p *Plugin) connect(ctx context.Context, rpc plugin.ClientProtocol) error {
	raw, err := rpc.Dispense(PluginName)
	if err != nil {
		return fmt.Errorf("dispense %q: %w", PluginName, err)
	}
	pull, ok := raw.(gpumetricsv1.MetricsPullServiceClient)
	if !ok {
		return fmt.Errorf("dispense %q: got %T, not a MetricsPullServiceClient", PluginName, raw)
	}
	grpcClient, ok := rpc.(*plugin.GRPCClient)
	if !ok {
		return fmt.Errorf("plugin protocol %q: only grpc is supported", p.client.Protocol())
	}
	p.pull = pull
	p.logs = gpumetricsv1.NewLogsPullServiceClient(grpcClient.Conn)
	p.health = healthpb.NewHealthClient(grpcClient.Conn)
	status, err := p.checkHealth(ctx)
	if err != nil {
		return err
	}
	p.logger.Info("Started the gpumetrics sidecar as a go-plugin subprocess",
		zap.Int("pid", p.Pid()), zap.Int("protocol_version", p.client.NegotiatedVersion()),
		zap.String("health", status.String()))
	if status != healthpb.HealthCheckResponse_SERVING {
		p.logger.Info("The sidecar is not ready yet (no collection stored); pulls fail until it is")
	}
	return nil
}

// checkHealth asks grpc.health.v1.Health/Check for service "plugin" (unlike go-plugin's Ping,
// it honours ctx's deadline). An error means the sidecar did not answer; any status, NOT_SERVING
// included (a sidecar whose first collection is not stored yet), means it is there.
func (p *Plugin) checkHealth(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
	resp, err := p.health.Check(ctx, &healthpb.HealthCheckRequest{Service: healthService})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return healthpb.HealthCheckResponse_SERVICE_UNKNOWN, nil // answered: no such name
		}
		return healthpb.HealthCheckResponse_UNKNOWN, fmt.Errorf("health check %q: %w", healthService, err)
	}
	return resp.GetStatus(), nil
}

// Pid returns the sidecar's process id, or 0 when it was never started.
func (p *Plugin) Pid() int {
	if rc := p.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// Pull calls MetricsPullService/Pull on the sidecar.
func (p *Plugin) Pull(ctx context.Context, req *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error) {
	return p.pull.Pull(ctx, req)
}

// PullLogs calls LogsPullService/PullLogs on the sidecar (over the plugin's connection).
func (p *Plugin) PullLogs(ctx context.Context, req *gpumetricsv1.PullLogsRequest) (*gpumetricsv1.PullLogsResponse, error) {
	return p.logs.PullLogs(ctx, req)
}

// Lost reports whether the process has exited or no longer answers its health check within ctx
// (whatever status it answers, it is there).
func (p *Plugin) Lost(ctx context.Context) bool {
	if p.client.Exited() {
		return true
	}
	_, err := p.checkHealth(ctx)
	return err != nil
}

// Close stops the sidecar: go-plugin's Kill calls plugin.GRPCController/Shutdown, waits up to 2 s
// for the process to exit and only then SIGKILLs it. If ctx ends before Kill returns (a sidecar
// that hangs in Shutdown), the process is SIGKILLed at once and Close waits for Kill to finish.
func (p *Plugin) Close(ctx context.Context) error {
	var err error
	p.closeOnce.Do(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.client.Kill()
		}()
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		p.logger.Warn("Sidecar did not stop before the shutdown deadline; killing it")
		if proc := p.cmd.Process; proc != nil {
			if kerr := proc.Kill(); kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
				err = fmt.Errorf("killing sidecar: %w", kerr)
			}
		}
		<-done
	})
	return err
}
