package gpumetricsreceiver

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

const unreachableMsg = "The gpumetrics sidecar is unreachable; the receiver tries again at every scrape"

// closedTCPEndpoint returns 127.0.0.1:<port> of a port the kernel just handed out and that no
// longer listens (connections are refused).
func closedTCPEndpoint(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

// TestRemoteUnreachableSidecarIsOneWarning: scrapes against an endpoint where nothing listens
// fail when their deadline ends (the Pull waits for the endpoint, probing it, as gRPC's
// wait-for-ready would), log one WARN with the endpoint and the next try (then DEBUG); gRPC never
// attempts a connection of its own (its channel stays IDLE, so it logs no "createTransport
// failed" line); the first scrape that gets through logs one INFO and uses a READY channel.
func TestRemoteUnreachableSidecarIsOneWarning(t *testing.T) {
	tests := []struct {
		name     string
		endpoint func(t *testing.T) (endpoint string, listen func() net.Listener)
		dialErr  string
	}{
		{
			name: "unix socket not there",
			endpoint: func(t *testing.T) (string, func() net.Listener) {
				path := filepath.Join(t.TempDir(), "pull.sock")
				return "unix://" + path, func() net.Listener {
					lis, err := net.Listen("unix", path)
					require.NoError(t, err)
					return lis
				}
			},
			dialErr: "no such file or directory",
		},
		{
			name: "tcp port refused",
			endpoint: func(t *testing.T) (string, func() net.Listener) {
				return closedTCPEndpoint(t), nil
			},
			dialErr: "connection refused",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			endpoint, listen := tt.endpoint(t)
			env := newTestEnv(t)
			s := newScraper(t, env, remoteConfig(endpoint))
			useFakeClock(s, time.Now())
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				_, err := s.scrape(ctx)
				cancel()
				var down *sidecar.UnreachableError
				require.ErrorAs(t, err, &down)
				assert.Equal(t, codes.Unavailable, status.Code(errors.Unwrap(err)), "retried like a starting sidecar")
				assert.Contains(t, err.Error(), "pull from the gpumetrics sidecar")
				assert.Contains(t, err.Error(), "the gpumetrics sidecar at "+endpoint+" is unreachable: ")
				assert.Contains(t, err.Error(), tt.dialErr, "the dial error, not the deadline")
			}

			logged := env.logs.FilterMessage(unreachableMsg)
			require.Equal(t, 3, logged.Len())
			warn := logged.FilterLevelExact(zapcore.WarnLevel).All()
			require.Len(t, warn, 1, "one WARN per outage")
			fields := warn[0].ContextMap()
			assert.Equal(t, endpoint, fields["endpoint"])
			assert.Contains(t, fields["error"], tt.dialErr)
			assert.Equal(t, 10*time.Second, fields["next_retry_in"], "the next scrape (collection_interval)")
			assert.Equal(t, 2, logged.FilterLevelExact(zapcore.DebugLevel).Len())

			remote, ok := s.conn.(*sidecar.Remote)
			require.True(t, ok)
			assert.Equal(t, connectivity.Idle, remote.State(), "gRPC made no connection attempt of its own")

			if listen == nil {
				return
			}
			fake := fakesidecar.New(fakesidecar.Options{})
			appendBatches(fake, 1, 1)
			serve(t, listen(), fake)
			next := newScriptedConsumer()
			scrapeErr, consumeErr := cycle(s, next)
			require.NoError(t, scrapeErr)
			require.NoError(t, consumeErr)
			assert.Equal(t, []string{"b1"}, next.batchLabels())
			back := env.logs.FilterMessage("The gpumetrics sidecar is reachable again").FilterLevelExact(zapcore.InfoLevel).All()
			require.Len(t, back, 1)
			assert.Equal(t, int64(3), back[0].ContextMap()["failed_scrapes"])
			assert.Equal(t, connectivity.Ready, remote.State())
			assert.Equal(t, 1, env.logs.FilterMessage(unreachableMsg).FilterLevelExact(zapcore.WarnLevel).Len())
		})
	}
}

// TestRemoteChannelLeftRetryingIsReplaced: a listener that accepts connections but speaks no
// gRPC passes the probe, so gRPC connects, fails and keeps retrying by itself; once nothing
// listens any more, the next Pull's failed probe replaces that channel by an idle one.
func TestRemoteChannelLeftRetryingIsReplaced(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.Close() // not HTTP/2: the gRPC attempt fails
			accepted <- struct{}{}
		}
	}()
	endpoint := lis.Addr().String()
	env := newTestEnv(t)
	s := newScraper(t, env, remoteConfig(endpoint))
	useFakeClock(s, time.Now())
	remote := s.conn.(*sidecar.Remote)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = s.scrape(ctx)
	cancel()
	require.Error(t, err)
	<-accepted // the probe's connection, at least
	require.NotEqual(t, connectivity.Idle, remote.State(), "gRPC tried and is retrying by itself")

	require.NoError(t, lis.Close())
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = s.scrape(ctx)
	cancel()
	var down *sidecar.UnreachableError
	require.ErrorAs(t, err, &down)
	assert.Equal(t, connectivity.Idle, remote.State(), "the retrying channel was replaced")
}
