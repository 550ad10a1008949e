package sidecar

import (
	"context"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// Conn is a connection to one sidecar's MetricsPullService and LogsPullService.
type Conn interface {
	// Pull calls gpumetrics.v1.MetricsPullService/Pull.
	Pull(ctx context.Context, req *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error)
	// PullLogs calls gpumetrics.v1.LogsPullService/PullLogs (GPU events). A sidecar without GPU
	// events answers UNIMPLEMENTED.
	PullLogs(ctx context.Context, req *gpumetricsv1.PullLogsRequest) (*gpumetricsv1.PullLogsResponse, error)
	// Lost reports, after a failed Pull, whether this connection is beyond repair and a new one
	// must be made: a subprocess that exited or no longer answers its health check. Remote
	// connections reconnect by themselves and never report lost.
	Lost(ctx context.Context) bool
	// Close releases the connection; for a subprocess it stops the process (see Plugin.Close).
	// It is safe to call more than once.
	Close(ctx context.Context) error
}
