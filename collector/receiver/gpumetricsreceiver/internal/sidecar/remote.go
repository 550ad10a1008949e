package sidecar

import (
	"context"
	"crypto/tls"
	"sync"

	"google.golang.org/grpc"

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

// Remote is a gRPC client connection to a running sidecar. It connects lazily and reconnects by
// itself. Calls wait for the connection to be ready until their context ends (the scrape
// timeout), so a sidecar that restarts between two pulls is waited for, and one that is down
// shows up as a failed Pull carrying the last connection error, never as a failed DialRemote.
type Remote struct {
	conn *grpc.ClientConn
	pull gpumetricsv1.MetricsPullServiceClient

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
	conn, err := sidecarconn.Dial(cfg.Target, cfg.TLS, grpc.WithDefaultCallOptions(callOpts...))
	if err != nil {
		return nil, err
	}
	return &Remote{conn: conn, pull: gpumetricsv1.NewMetricsPullServiceClient(conn)}, nil
}

// Pull calls MetricsPullService/Pull on the sidecar.
func (r *Remote) Pull(ctx context.Context, req *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error) {
	return r.pull.Pull(ctx, req)
}

// Lost is always false: the gRPC connection reconnects by itself.
func (r *Remote) Lost(context.Context) bool { return false }

// Close closes the client connection.
func (r *Remote) Close(context.Context) error {
	r.closeOnce.Do(func() { r.closeErr = r.conn.Close() })
	return r.closeErr
}
