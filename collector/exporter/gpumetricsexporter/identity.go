package gpumetricsexporter

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

const (
	attrExecutablePath = "process.executable.path" // semconv; the profiler's readlink of /proc/<pid>/exe
	attrCreationTime   = "process.creation.time"   // semconv, ISO 8601; not set by the eBPF profiler
	deletedSuffix      = " (deleted)"              // readlink of an exe whose file was replaced
	// userHZ is the unit of /proc/<pid>/stat's starttime: USER_HZ, 100 on every architecture Go
	// supports on Linux (sysconf(_SC_CLK_TCK); proc(5)).
	userHZ = 100
	// creationTimeSlack allows for btime's whole seconds and the profile's rounding.
	creationTimeSlack = time.Second
)

// newestPerProcess returns the indices of rps to declare, in request order: every resource,
// except that of several resources with one pid (the process exec'd, or its pid was reused,
// between two samples of one reporting interval: the eBPF profiler keys a resource by
// executable, container and pid) only the one with the newest sample is kept (latestSample); on
// a tie, the later in the request. Resources without a usable pid are kept for declare to count.
func newestPerProcess(rps pprofile.ResourceProfilesSlice) []int {
	n := rps.Len()
	keep := make([]int, 0, n)
	var at map[uint32]int // pid -> index into keep; made at the first pid
	for i := range n {
		pid, ok := processPID(rps.At(i).Resource().Attributes())
		if !ok {
			keep = append(keep, i)
			continue
		}
		if at == nil {
			at = make(map[uint32]int, n)
		}
		j, dup := at[pid]
		if !dup {
			at[pid] = len(keep)
			keep = append(keep, i)
			continue
		}
		if latestSample(rps.At(i)) >= latestSample(rps.At(keep[j])) {
			keep[j] = i
		}
	}
	return keep
}

// latestSample returns the newest sample time of rp's profiles (ns since the Unix epoch): the
// largest of the samples' timestamps_unix_nano, or where a profile has none, its time plus its
// duration (the end of its collection window). 0 when rp has no profile.
func latestSample(rp pprofile.ResourceProfiles) uint64 {
	var latest uint64
	sps := rp.ScopeProfiles()
	for i := range sps.Len() {
		profs := sps.At(i).Profiles()
		for j := range profs.Len() {
			p := profs.At(j)
			stamped := false
			samples := p.Samples()
			for k := range samples.Len() {
				ts := samples.At(k).TimestampsUnixNano()
				for l := range ts.Len() {
					stamped = true
					latest = max(latest, ts.At(l))
				}
			}
			if !stamped {
				latest = max(latest, uint64(p.Time())+p.DurationNano())
			}
		}
	}
	return latest
}

// difference is what a profile says about its pid against what proc_root shows there.
type difference struct {
	key, profile, proc string
}

// procIdentity compares a profile's resource with the process proc_root shows under its pid,
// so that a profile from another pid namespace (a Collector without the host's pid namespace,
// or a proc_root that is not the profiler's) is not declared under an unrelated process's pid.
type procIdentity struct {
	root string

	bootOnce sync.Once
	boot     time.Time // btime of <root>/stat; zero when unreadable
}

func newProcIdentity(root string) *procIdentity { return &procIdentity{root: root} }

// differs reports the first attribute of attrs that proc_root contradicts for pid:
//   - process.executable.path (string) against the target of <root>/<pid>/exe, equal up to a
//     " (deleted)" suffix (the file was replaced between the two reads); not compared when the
//     link cannot be read (a kernel thread, no permission, the process just exited);
//   - process.creation.time (ISO 8601 string, if the profiler sets one) against btime of
//     <root>/stat plus start (ticks of USER_HZ), within creationTimeSlack; only when haveStart.
func (p *procIdentity) differs(pid uint32, attrs pcommon.Map, start uint64, haveStart bool) (difference, bool) {
	dir := filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10))
	if v, ok := attrs.Get(attrExecutablePath); ok && v.Type() == pcommon.ValueTypeStr {
		if target, err := os.Readlink(filepath.Join(dir, "exe")); err == nil && !sameExecutable(v.Str(), target) {
			return difference{attrExecutablePath, v.Str(), target}, true
		}
	}
	if v, ok := attrs.Get(attrCreationTime); ok && v.Type() == pcommon.ValueTypeStr && haveStart {
		created, err := time.Parse(time.RFC3339Nano, v.Str())
		if boot := p.bootTime(); err == nil && !boot.IsZero() && start <= math.MaxInt64/uint64(time.Second/userHZ) {
			started := boot.Add(time.Duration(start) * (time.Second / userHZ)) //nolint:gosec // bounded above
			if d := created.Sub(started); d > creationTimeSlack || d < -creationTimeSlack {
				return difference{attrCreationTime, v.Str(), started.UTC().Format(time.RFC3339Nano)}, true
			}
		}
	}
	return difference{}, false
}

func sameExecutable(profile, proc string) bool {
	return strings.TrimSuffix(profile, deletedSuffix) == strings.TrimSuffix(proc, deletedSuffix)
}

// bootTime reads btime (seconds since the Unix epoch) from <root>/stat once.
func (p *procIdentity) bootTime() time.Time {
	p.bootOnce.Do(func() {
		b, err := os.ReadFile(filepath.Join(p.root, "stat"))
		if err != nil {
			return
		}
		for line := range bytes.Lines(b) {
			if rest, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
				if s, err := strconv.ParseInt(string(bytes.TrimSpace(rest)), 10, 64); err == nil {
					p.boot = time.Unix(s, 0)
				}
				return
			}
		}
	})
	return p.boot
}
