package gpumetricsexporter

import (
	"sync"
	"time"
)

// tracked is what the exporter knows of a declared process to decide when to release it.
type tracked struct {
	pid   uint32
	start uint64    // start time it was declared with (0: unknown)
	fp    uint64    // declarer.Fingerprint of its resource alone, as declared
	seen  time.Time // last profile
}

// tracker holds every process the exporter declared (bounded like the declarer client: only
// processes it accepted are tracked, and each is released with it).
type tracker struct {
	mu    sync.Mutex
	procs map[uint32]tracked
}

func newTracker() *tracker { return &tracker{procs: make(map[uint32]tracked)} }

// declared records that pid was declared with start and a resource of fingerprint fp, at now.
func (t *tracker) declared(pid uint32, start, fp uint64, now time.Time) {
	t.mu.Lock()
	t.procs[pid] = tracked{pid: pid, start: start, fp: fp, seen: now}
	t.mu.Unlock()
}

// seenUnchanged records a profile of pid at now if pid is tracked with a resource of
// fingerprint fp, and reports whether it was.
func (t *tracker) seenUnchanged(pid uint32, fp uint64, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok || p.fp != fp {
		return false
	}
	p.seen = now
	t.procs[pid] = p
	return true
}

// snapshot returns every tracked process (procfs is read outside the lock).
func (t *tracker) snapshot() []tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]tracked, 0, len(t.procs))
	for _, p := range t.procs {
		out = append(out, p)
	}
	return out
}

// forget drops p if nothing was recorded for its pid since the snapshot it came from (a profile
// of a process that reused the pid meanwhile is kept), and reports whether it did.
func (t *tracker) forget(p tracked) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.procs[p.pid]; !ok || cur != p {
		return false
	}
	delete(t.procs, p.pid)
	return true
}

// len returns the number of tracked processes.
func (t *tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.procs)
}
