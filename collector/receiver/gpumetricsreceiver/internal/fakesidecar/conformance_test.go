package fakesidecar

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpumetrics/gpumetrics/collector/internal/conformance"
	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// TestConformance runs every pull and logs case of tests/testdata/conformance against the fake,
// served over gRPC as the receiver's tests serve it (with TrackDeliveries), so the fake keeps the
// rules the real sidecar's store is held to by the same cases.
func TestConformance(t *testing.T) {
	conformance.RunAll(t, []string{"pull", "logs"}, func(conformance.Case) bool { return true },
		func(t *testing.T, c conformance.Case) conformance.Target { return newFakeTarget(t, c) })
}

// fakeTarget is a metric and a log store of the fake on one gRPC server on a unix socket.
type fakeTarget struct {
	metrics *Server
	logs    *LogsServer
	conn    *grpc.ClientConn
	clock   atomic.Int64 // ns on the stores' clock
	lives   int
}

// fakeConfig is what a case's config sets that the fake models.
type fakeConfig struct {
	metrics, logs Limits
	defaultMax    uint64
	maxSend       int
}

// configure maps a case's sidecar configuration onto the fake; a key it does not model fails
// the test (identity.*, which the pull services do not read, is accepted and has no effect).
func configure(t *testing.T, config map[string]any) fakeConfig {
	t.Helper()
	var fc fakeConfig
	num := func(section, key string, v any) uint64 {
		n, ok := v.(int)
		require.Truef(t, ok && n > 0, "config %s.%s: a positive integer, got %v", section, key, v)
		return uint64(n)
	}
	seconds := func(section, key string, v any) time.Duration {
		switch n := v.(type) {
		case int:
			return time.Duration(n) * time.Second
		case float64:
			return time.Duration(n * float64(time.Second))
		}
		t.Fatalf("config %s.%s: seconds, got %v", section, key, v)
		return 0
	}
	keys := make([]string, 0, len(config))
	for k := range config {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, section := range keys {
		if section == "identity" {
			continue
		}
		values, ok := config[section].(map[string]any)
		require.Truef(t, ok, "config %s: a mapping", section)
		for key, v := range values {
			switch section + "." + key {
			case "store.max_data_points":
				fc.metrics.MaxDataPoints = num(section, key, v)
			case "store.max_bytes":
				fc.metrics.MaxBytes = num(section, key, v)
			case "store.max_age_s":
				fc.metrics.MaxAge = seconds(section, key, v)
			case "store.max_consumers":
				fc.metrics.MaxConsumers = int(num(section, key, v)) //nolint:gosec // small
			case "events.max_log_records":
				fc.logs.MaxDataPoints = num(section, key, v)
			case "events.max_bytes":
				fc.logs.MaxBytes = num(section, key, v)
			case "events.max_age_s":
				fc.logs.MaxAge = seconds(section, key, v)
			case "server.max_send_message_bytes":
				fc.maxSend = int(num(section, key, v)) //nolint:gosec // small
			case "server.pull_default_max_bytes":
				fc.defaultMax = num(section, key, v)
			default:
				t.Fatalf("config %s.%s: the fake sidecar does not model it", section, key)
			}
		}
	}
	fc.logs.MaxConsumers = fc.metrics.MaxConsumers // the log store has the metric store's consumer limits
	return fc
}

func newFakeTarget(t *testing.T, c conformance.Case) *fakeTarget {
	t.Helper()
	fc := configure(t, c.Config)
	ft := &fakeTarget{}
	ft.clock.Store(time.Unix(1000, 0).UnixNano())
	now := func() time.Time { return time.Unix(0, ft.clock.Load()) }
	ft.metrics = New(Options{Epoch: "metrics-1", Limits: fc.metrics, DefaultMaxBytes: fc.defaultMax, Now: now})
	ft.logs = NewLogs(Options{Epoch: "logs-1", Limits: fc.logs, DefaultMaxBytes: fc.defaultMax, Now: now})
	opts := []grpc.ServerOption{TrackDeliveries()}
	if fc.maxSend > 0 {
		opts = append(opts, grpc.MaxSendMsgSize(fc.maxSend))
	}
	srv := grpc.NewServer(opts...)
	gpumetricsv1.RegisterMetricsPullServiceServer(srv, ft.metrics)
	gpumetricsv1.RegisterLogsPullServiceServer(srv, ft.logs)
	dir, err := os.MkdirTemp("", "gmf-") // short: a unix socket path has at most 107 bytes
	require.NoError(t, err)
	lis, err := net.Listen("unix", filepath.Join(dir, "fake.sock"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	ft.conn, err = grpc.NewClient("unix://"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = ft.conn.Close()
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("fake sidecar: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	return ft
}

func (f *fakeTarget) Conn() grpc.ClientConnInterface { return f.conn }

// Restart restarts both stores with new epochs.
func (f *fakeTarget) Restart(testing.TB) {
	f.lives++
	f.metrics.Restart(fmt.Sprintf("metrics-%d", f.lives+1))
	f.logs.Store.Restart(fmt.Sprintf("logs-%d", f.lives+1))
}

func (f *fakeTarget) store(service string) *Server {
	if service == "logs" {
		return f.logs.Store
	}
	return f.metrics
}

func (f *fakeTarget) Append(_ testing.TB, service string, data []byte, items uint64) uint64 {
	return f.store(service).AppendSerialized(data, items)
}

func (f *fakeTarget) Advance(d time.Duration) { f.clock.Add(int64(d)) }

func (f *fakeTarget) Held(service string) []uint64 { return f.store(service).HeldSequences() }
