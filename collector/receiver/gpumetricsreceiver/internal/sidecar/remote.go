package sidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
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

// reconnectBackoff keeps reconnection attempts to a restarted sidecar frequent: gRPC's default
// backoff grows to 2 minutes, longer than many collection intervals.
var reconnectBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}

// minConnectTimeout bounds one connection attempt.
const minConnectTimeout = 5 * time.Second

// Remote is a gRPC client connection to a running sidecar. It connects lazily and reconnects by
// itself. Calls wait for the connection to be ready until their context ends (the scrape
// timeout), so a sidecar that restarts between two pulls is waited for, and one that is down
// shows up as a failed Pull carrying the last connection error, never as a failed DialRemote.
type Remote struct {
	conn *grpc.ClientConn
	pull gpumetricsv1.MetricsPullServiceClient
	logs gpumetricsv1.LogsPullServiceClient

	closeOnce sync.Once
	closeErr  error
}

var _ Conn = (*Remote)(nil)

// DialRemote creates the client connection. It does not contact the sidecar.
func DialRemote(cfg RemoteConfig) (*Remote, error) {
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	callOpts := []grpc.CallOption{grpc.WaitForReady(true)}
	if cfg.MaxRecvMsgSize > 0 {
		callOpts = append(callOpts, grpc.MaxCallRecvMsgSize(cfg.MaxRecvMsgSize))
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(callOpts...),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff, MinConnectTimeout: minConnectTimeout}),
	}
	conn, err := grpc.NewClient(cfg.Target, opts...)
	if err != nil {
		return nil, fmt.Errorf("sidecar endpoint %q: %w", cfg.Target, err)
	}
	return &Remote{
		conn: conn,
		pull: gpumetricsv1.NewMetricsPullServiceClient(conn),
		logs: gpumetricsv1.NewLogsPullServiceClient(conn),
	}, nil
}

// Pull calls MetricsPullService/Pull on the sidecar.
func (r *Remote) Pull(ctx context.Context, req *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error) {
	return r.pull.Pull(ctx, req)
}

// PullLogs calls LogsPullService/PullLogs on the sidecar.
func (r *Remote) PullLogs(ctx context.Context, req *gpumetricsv1.PullLogsRequest) (*gpumetricsv1.PullLogsResponse, error) {
	return r.logs.PullLogs(ctx, req)
}

// Lost is always false: the gRPC connection reconnects by itself.
func (r *Remote) Lost(context.Context) bool { return false }

// Close closes the client connection.
func (r *Remote) Close(context.Context) error {
	r.closeOnce.Do(func() { r.closeErr = r.conn.Close() })
	return r.closeErr
}
