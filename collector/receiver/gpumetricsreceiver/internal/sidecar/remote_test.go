package sidecar

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

type answering struct {
	gpumetricsv1.UnimplementedMetricsPullServiceServer
}

func (answering) Pull(context.Context, *gpumetricsv1.PullRequest) (*gpumetricsv1.PullResponse, error) {
	return &gpumetricsv1.PullResponse{Epoch: "e1"}, nil
}

// TestPullWaitsForASidecarThatComesUp: a Pull to an endpoint where nothing listens yet keeps
// probing within its context, as gRPC's wait-for-ready would, and goes through once a sidecar
// listens (a restart shorter than the scrape's timeout costs no failed scrape).
func TestPullWaitsForASidecarThatComesUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pull.sock")
	r, err := DialRemote(RemoteConfig{Target: "unix://" + path})
	require.NoError(t, err)
	defer func() { _ = r.Close(context.Background()) }()
	refused := make(chan struct{})
	var once sync.Once
	r.probed = func(err error) {
		if err != nil {
			once.Do(func() { close(refused) })
		}
	}
	type result struct {
		resp *gpumetricsv1.PullResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := r.Pull(ctx, &gpumetricsv1.PullRequest{Consumer: "c"})
		done <- result{resp, err}
	}()
	<-refused // the Pull found nothing listening and is waiting
	assert.Equal(t, connectivity.Idle, r.State(), "gRPC has not tried to connect")

	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	srv := grpc.NewServer()
	gpumetricsv1.RegisterMetricsPullServiceServer(srv, answering{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	got := <-done
	require.NoError(t, got.err)
	assert.Equal(t, "e1", got.resp.GetEpoch())
	assert.Equal(t, connectivity.Ready, r.State())
}
