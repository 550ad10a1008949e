// Command testplugin is a go-plugin plugin serving the fake MetricsPullService, for the receiver's
// subprocess-mode tests. It starts with three batches, each a resource carrying its own
// process.pid, and writes one hclog-style line to stderr before serving.
//
// Environment (set through the receiver's `env`):
//
//	TESTPLUGIN_BATCHES  number of initial batches (default 3)
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/hashicorp/go-plugin"

	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

func main() {
	n := 3
	if v := os.Getenv("TESTPLUGIN_BATCHES"); v != "" {
		parsed, err := strconv.Atoi(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "[ERROR] TESTPLUGIN_BATCHES=%q: %v\n", v, err)
			os.Exit(2)
		}
		n = parsed
	}
	pid := os.Getpid()
	fake := fakesidecar.New(fakesidecar.Options{Epoch: "pid-" + strconv.Itoa(pid), MaxBatchesPerPull: 2})
	for i := range n {
		md := fakesidecar.Gauge("b"+strconv.Itoa(i+1), 2)
		md.ResourceMetrics().At(0).Resource().Attributes().PutInt("process.pid", int64(pid))
		fake.Append(md)
	}
	fmt.Fprintf(os.Stderr, "[INFO] testplugin serving: batches=%d\n", n)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: sidecar.Handshake,
		Plugins:         plugin.PluginSet{sidecar.PluginName: &sidecar.PullPlugin{Impl: fake}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
