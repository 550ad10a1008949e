// Command testplugin is a go-plugin plugin serving the fake MetricsPullService and
// LogsPullService, for the receiver's subprocess-mode tests. It starts with three metric batches,
// each a resource carrying its own process.pid, and one log batch of events (resource attribute
// process.pid too), and writes one hclog-style line to stderr before serving.
//
// Environment (set through the receiver's `env`):
//
//	TESTPLUGIN_BATCHES            number of initial batches (default 3)
//	TESTPLUGIN_EVENTS             log records in the one initial log batch (default 2; 0: none)
//	TESTPLUGIN_UNAVAILABLE_PULLS  the first this many Pulls fail with UNAVAILABLE, as a sidecar
//	                              whose first collection is not stored yet answers (default 0)
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

// intEnv returns the integer value of the environment variable key, or def when it is unset;
// a value that is not an integer ends the process.
func intEnv(key string, def int) int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	parsed, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "[ERROR] %s=%q: %v\n", key, v, err)
		os.Exit(2)
	}
	return parsed
}

func main() {
	n := intEnv("TESTPLUGIN_BATCHES", 3)
	pid := os.Getpid()
	fake := fakesidecar.New(fakesidecar.Options{Epoch: "pid-" + strconv.Itoa(pid), MaxBatchesPerPull: 2})
	for i := range intEnv("TESTPLUGIN_UNAVAILABLE_PULLS", 0) {
		fake.FailRequest(i+1, status.Error(codes.Unavailable, "no collection has been stored yet; retry later"))
	}
	for i := range n {
		md := fakesidecar.Gauge("b"+strconv.Itoa(i+1), 2)
		md.ResourceMetrics().At(0).Resource().Attributes().PutInt("process.pid", int64(pid))
		fake.Append(md)
	}
	logs := fakesidecar.NewLogs(fakesidecar.Options{Epoch: "logs-pid-" + strconv.Itoa(pid)})
	if events := intEnv("TESTPLUGIN_EVENTS", 2); events > 0 {
		ld := fakesidecar.Event("e1", events)
		ld.ResourceLogs().At(0).Resource().Attributes().PutInt("process.pid", int64(pid))
		logs.AppendLogs(ld)
	}
	fmt.Fprintf(os.Stderr, "[INFO] testplugin serving: batches=%d\n", n)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: sidecar.Handshake,
		Plugins:         plugin.PluginSet{sidecar.PluginName: &sidecar.PullPlugin{Impl: fake, Logs: logs}},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return plugin.DefaultGRPCServer(append(opts, fakesidecar.TrackDeliveries()))
		},
	})
}
