package sidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/internal/sidecarconn"
)

// RemoteConfig says how to reach a sidecar that runs on its own.
type RemoteConfig struct {
	// Target is a gRPC target: "host:port" or "unix:///absolute/path".
	Target string
	// TLS is the client TLS configuration; nil means plaintext.
	TLS *tls.Config
	// MaxRecvMsgSize bounds one PullResponse, in bytes (gRPC's default is 4 MiB).
	MaxRecvMsgSize int
}

// probeTimeout bounds one probe's connect (as sidecarconn bounds one gRPC connection attempt).
const probeTimeout = 5 * time.Second

// Probes of an unreachable endpoint within one Pull start probeInitialDelay apart and grow ×1.6
// up to probeMaxDelay, so a sidecar that comes back is found within half a second.
const (
	probeInitialDelay = 100 * time.Millisecond
	probeMaxDelay     = 500 * time.Millisecond
)

// UnreachableError is the error of a Pull that was not sent because nothing accepted a
// connection at the endpoint. It is a gRPC UNAVAILABLE (status.Code), so a scrape retries it
// as it retries a starting sidecar.
type UnreachableError struct {
	// Endpoint is the configured endpoint.
	Endpoint string
	// Err is the dial error, e.g. "connect: connection refused".
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("the gpumetrics sidecar at %s is unreachable: %v", e.Endpoint, e.Err)
}

// Unwrap returns Err.
func (e *UnreachableError) Unwrap() error { return e.Err }

// GRPCStatus makes the error an UNAVAILABLE for status.Code and status.FromError.
func (e *UnreachableError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// Remote is a gRPC client connection to a running sidecar. It connects lazily and reconnects by
// itself. Calls wait for the connection to be ready until their context ends (the scrape
// timeout), so a sidecar that restarts between two pulls is waited for, and one that is down
// shows up as a failed Pull carrying the connection error, never as a failed DialRemote.
//
// Before a Pull on a connection that is not READY, the endpoint is dialled (a plain TCP or unix
// connect, closed at once; TLS and gRPC are not spoken), again and again with a backoff of
// 100 ms growing to 0.5 s until it accepts or the Pull's context ends; only then is gRPC asked to
// connect. A Pull to an endpoint that stays unreachable fails when its context ends, with an
// *UnreachableError carrying the dial error. Each failed gRPC connection attempt logs a
// "createTransport failed" WARN line through the Collector's gRPC logger, and a channel whose
// attempt failed keeps retrying by itself (every 5 s at most, sidecarconn.Dial), so an
// unreachable sidecar filled the log; now gRPC only connects to a listening endpoint. A channel
// left retrying after a failed attempt is replaced by a fresh, idle one.
type Remote struct {
	target  string
	network string // "tcp" or "unix"
	address string // host:port, or the socket path
	tls     *tls.Config
	opts    []grpc.DialOption
	// probed, when set (tests), is called with the outcome of every probe.
	probed func(error)

	mu   sync.Mutex
	conn *grpc.ClientConn

	closeOnce sync.Once
	closeErr  error
}

var _ Conn = (*Remote)(nil)

// DialRemote creates the client connection. It does not contact the sidecar.
func DialRemote(cfg RemoteConfig) (*Remote, error) {
	callOpts := []grpc.CallOption{grpc.WaitForReady(true)}
	if cfg.MaxRecvMsgSize > 0 {
		callOpts = append(callOpts, grpc.MaxCallRecvMsgSize(cfg.MaxRecvMsgSize))
	}
	r := &Remote{target: cfg.Target, tls: cfg.TLS, opts: []grpc.DialOption{grpc.WithDefaultCallOptions(callOpts...)}}
	r.network, r.address = dialAddress(cfg.Target)
	if err := r.newConn(); err != nil {
		return nil, err
	}
	return r, nil
}

// dialAddress returns the network and address a probe dials for a gRPC target: "unix" and the
// path for unix:///path and unix:/path, else "tcp" and host:port.
func dialAddress(target string) (network, address string) {
	if path, ok := strings.CutPrefix(target, "unix://"); ok {
		return "unix", path
	}
	if path, ok := strings.CutPrefix(target, "unix:"); ok {
		return "unix", path
	}
	return "tcp", target
}

func (r *Remote) newConn() error {
	conn, err := sidecarconn.Dial(r.target, r.tls, r.opts...)
	if err != nil {
		return err
	}
	r.conn = conn
	return nil
}

// State returns the gRPC connection's state (IDLE until a Pull found the endpoint reachable).
func (r *Remote) State() connectivity.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conn.GetState()
}

// Pull calls MetricsPullService/Pull on the sidecar; on a connection that is not READY, only
// once a probe found the endpoint reachable within ctx (see Remote).
func (r *Remote) Pull(ctx context.Context, req *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error) {
	conn, err := r.reachable(ctx)
	if err != nil {
		return nil, err
	}
	return gpumetricsv1.NewMetricsPullServiceClient(conn).Pull(ctx, req)
}

// PullLogs calls LogsPullService/PullLogs on the sidecar, waiting for it as Pull does.
func (r *Remote) PullLogs(ctx context.Context, req *gpumetricsv1.PullLogsRequest) (*gpumetricsv1.PullLogsResponse, error) {
	conn, err := r.reachable(ctx)
	if err != nil {
		return nil, err
	}
	return gpumetricsv1.NewLogsPullServiceClient(conn).PullLogs(ctx, req)
}

// reachable returns the channel a call may use now: the current one when READY, else only once
// a probe found the endpoint reachable within ctx (a channel left retrying by itself after a
// failed attempt is replaced by a fresh one first).
func (r *Remote) reachable(ctx context.Context) (*grpc.ClientConn, error) {
	r.mu.Lock()
	conn := r.conn
	r.mu.Unlock()
	if state := conn.GetState(); state != connectivity.Ready {
		err := r.probe(ctx)
		if err != nil && (state == connectivity.TransientFailure || state == connectivity.Connecting) {
			r.replace(conn) // stop its own reconnection attempts
			r.mu.Lock()
			conn = r.conn
			r.mu.Unlock()
		}
		if err != nil {
			if err = r.waitReachable(ctx, err); err != nil {
				return nil, err
			}
		}
	}
	return conn, nil
}

// waitReachable probes again, with the probe backoff, until the endpoint accepts a connection
// (nil) or ctx ends: then it returns the last probe's error.
func (r *Remote) waitReachable(ctx context.Context, last error) error {
	delay := probeInitialDelay
	for {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return last
		case <-t.C:
		}
		err := r.probe(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil {
			last = err // a dial cut short by ctx says less than the one before
		}
		delay = min(delay*16/10, probeMaxDelay)
	}
}

// probe dials the endpoint once, within ctx and probeTimeout, and closes the connection.
func (r *Remote) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, r.network, r.address)
	if err != nil {
		err = &UnreachableError{Endpoint: r.target, Err: err}
	} else {
		_ = c.Close() // it was accepted: reachable
	}
	if r.probed != nil {
		r.probed(err)
	}
	return err
}

// replace swaps old, a channel retrying by itself, for a fresh idle one.
func (r *Remote) replace(old *grpc.ClientConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != old {
		return
	}
	if err := r.newConn(); err != nil {
		return // NewClient failed for a target it accepted before: keep the old channel
	}
	_ = old.Close()
}

// Lost is always false: the gRPC connection reconnects by itself.
func (r *Remote) Lost(context.Context) bool { return false }

// Close closes the client connection.
func (r *Remote) Close(context.Context) error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.closeErr = r.conn.Close()
	})
	return r.closeErr
}
