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

// miss is a resource that could not be declared, remembered until until.
type miss struct {
	fp    uint64
	until time.Time
}

// misses remembers, per pid, the last resource that could not be declared (its pid was gone
// from proc_root, or proc_root showed another process there), so that the same resource in the
// next reports costs no procfs read and is counted and logged once: until a profile of the pid
// brings another resource, or until the entry expires. Bounded: at most max pids (expired
// entries are dropped to make room; a full table remembers nothing more).
type misses struct {
	mu  sync.Mutex
	m   map[uint32]miss
	max int
}

func newMisses(maxEntries int) *misses { return &misses{m: make(map[uint32]miss), max: maxEntries} }

// recent reports whether pid's resource of fingerprint fp could not be declared and its entry
// has not expired at now.
func (m *misses) recent(pid uint32, fp uint64, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[pid]
	return ok && e.fp == fp && now.Before(e.until)
}

// add remembers that pid's resource of fingerprint fp could not be declared, until until.
func (m *misses) add(pid uint32, fp uint64, now, until time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.m[pid]; !ok && len(m.m) >= m.max {
		for p, e := range m.m {
			if !now.Before(e.until) {
				delete(m.m, p)
			}
		}
		if len(m.m) >= m.max {
			return
		}
	}
	m.m[pid] = miss{fp: fp, until: until}
}

// forget drops what is remembered for pid (it was declared).
func (m *misses) forget(pid uint32) {
	m.mu.Lock()
	delete(m.m, pid)
	m.mu.Unlock()
}
