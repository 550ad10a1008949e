// Package declarer is a client of the gpumetrics sidecar's profiler integration service
// (gpumetrics.v1.ProfilerIntegrationService, proto/gpumetrics/v1/profiler.proto) for profiling
// agents: it declares each profiled process's identity, the resource the agent puts on that
// process's profiles, so the sidecar puts the process's GPU metrics on the same resource.
//
// The API is three calls on a Client, all non-blocking and safe for concurrent use:
//
//   - Declare(Process) records a process's latest declaration (pid, start time, the profile
//     resource's attributes, captured environment variables); only a declaration whose fingerprint
//     changed is sent;
//   - Exit(pid, startTimeTicks) releases it when the process is gone;
//   - Resync([]Process) replaces the whole set with the agent's complete view.
//
// One goroutine keeps a StreamDeclarations stream to the sidecar, waits for a sidecar that is
// down, and after every (re)connect replays every held process between ResyncBegin and ResyncEnd,
// so the sidecar drops whatever this declarer (Options.Name) declared before and no longer
// holds. Declarations go in DeclareBatch events (up to 256 per event, one answer each), or one
// declare event each to a sidecar that predates DeclareBatch. The Collector's gpumetrics exporter (collector/exporter/gpumetricsexporter) is built on
// it; examples/declarer is a runnable agent. docs/protocol.md describes the protocol.
//
//	conn, _ := grpc.NewClient("unix:///run/gpumetrics/profiler.sock",
//		grpc.WithTransportCredentials(insecure.NewCredentials()))
//	c, _ := declarer.New(conn, declarer.Options{Name: "my-agent"})
//	_ = c.Start()
//	res := pcommon.NewMap()
//	res.PutInt("process.pid", 4242)
//	start, _ := declarer.StartTimeTicks("/proc", 4242)
//	_, _ = c.Declare(declarer.Process{PID: 4242, StartTimeTicks: start, Resource: res})
//	...
//	c.Exit(4242, start)
//	_ = c.Close(ctx)
package declarer
