package gpumetricsexporter

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// benchProcesses is the node size of the benchmarks: 10,000 profiled processes.
const benchProcesses = 10_000

// benchBatch is one profiler report of n processes shaped like the real profiler's resources
// (testdata/ebpf-profiler): pid, executable path and name, a container id and two OTEL_*
// variables; variant changes one variable's value, so every process's declaration changes.
func benchBatch(n, variant int) pprofile.Profiles {
	procs := make([]profilerProcess, n)
	for i := range procs {
		procs[i] = profilerProcess{
			pid:         uint32(100_000 + i),
			exe:         "/usr/local/bin/python3.11",
			containerID: fmt.Sprintf("%064x", i),
			env: map[string]string{
				"OTEL_SERVICE_NAME":        "trainer-" + strconv.Itoa(i%50),
				"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=prod,service.version=" + strconv.Itoa(variant),
			},
		}
	}
	return profiles(procs...)
}

// benchRig is a started exporter on a recording sidecar with a fake procfs holding n processes.
func benchRig(b *testing.B, n int) *rig {
	b.Helper()
	r := newRig(b, true, func(c *Config) { c.MaxProcesses = 2 * n })
	r.srv.Discard = true // the exporter's memory is measured, not the recorder's
	for i := range n {
		r.proc.set(uint32(100_000+i), uint64(1000+i))
	}
	return r
}

// waitDeclared waits until the sidecar answered want declarations in total.
func waitDeclared(b *testing.B, r *rig, want uint64) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for r.exp.currentClient().Stats().Declared < want {
		if time.Now().After(deadline) {
			b.Fatalf("declared %d of %d", r.exp.currentClient().Stats().Declared, want)
		}
		time.Sleep(time.Millisecond) // polling interval inside the deadline
	}
}

// BenchmarkConsumeUnchanged: a report of 10,000 processes that are all declared already (the
// steady state: the profiler reports every 5 s, attributes rarely change). Per operation: one
// report; ns/resource and allocations per report are reported.
func BenchmarkConsumeUnchanged(b *testing.B) {
	r := benchRig(b, benchProcesses)
	pd := benchBatch(benchProcesses, 0)
	require.NoError(b, r.exp.consumeProfiles(context.Background(), pd))
	waitDeclared(b, r, benchProcesses)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_ = r.exp.consumeProfiles(context.Background(), pd)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchProcesses), "ns/resource")
}

// BenchmarkConsumeChanged: every process of the 10,000 changed since the last report, so each
// is encoded and queued (what ConsumeProfiles costs; it never waits for the sidecar).
func BenchmarkConsumeChanged(b *testing.B) {
	r := benchRig(b, benchProcesses)
	batches := []pprofile.Profiles{benchBatch(benchProcesses, 0), benchBatch(benchProcesses, 1)}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		_ = r.exp.consumeProfiles(context.Background(), batches[i%2])
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchProcesses), "ns/resource")
}

// BenchmarkDeclareAndResync10k: from a first report of 10,000 new processes to every one
// answered by the (recording) sidecar over a unix socket, then a sidecar restart and the full
// resync answered; reports declarations per second of each phase and the heap held per process.
func BenchmarkDeclareAndResync10k(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		r := benchRig(b, benchProcesses)
		pd := benchBatch(benchProcesses, 0)
		b.StartTimer()

		start := time.Now()
		require.NoError(b, r.exp.consumeProfiles(context.Background(), pd))
		waitDeclared(b, r, benchProcesses)
		first := time.Since(start)

		start = time.Now()
		r.lis.Stop()
		r.lis.Start()
		waitDeclared(b, r, 2*benchProcesses)
		resync := time.Since(start)

		b.StopTimer()
		pd = pprofile.Profiles{} // only the exporter's state stays reachable
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		held := float64(after.HeapAlloc) - float64(before.HeapAlloc)
		b.ReportMetric(float64(benchProcesses)/first.Seconds(), "declarations/s")
		b.ReportMetric(float64(benchProcesses)/resync.Seconds(), "resync-declarations/s")
		b.ReportMetric(held/float64(benchProcesses), "heap-B/process")
		runtime.KeepAlive(r)
		b.StartTimer()
	}
}

// BenchmarkSweep10k: one exit check of 10,000 live processes (a stat read each in proc_root,
// here a fake one on the test's temporary file system), what runs every exit_check_interval.
func BenchmarkSweep10k(b *testing.B) {
	r := benchRig(b, benchProcesses)
	require.NoError(b, r.exp.consumeProfiles(context.Background(), benchBatch(benchProcesses, 0)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r.sweep()
	}
	b.StopTimer()
	require.Equal(b, benchProcesses, r.exp.tracker.len(), "nothing exited")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchProcesses), "ns/process")
}
