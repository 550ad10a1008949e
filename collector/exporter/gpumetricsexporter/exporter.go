package gpumetricsexporter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/gpumetrics/gpumetrics/collector/exporter/gpumetricsexporter/internal/metadata"
	"github.com/gpumetrics/gpumetrics/collector/internal/sidecarconn"
	"github.com/gpumetrics/gpumetrics/collector/pkg/declarer"
)

// shutdownFlushTimeout bounds how long Shutdown sends what is pending: the Collector's shutdown
// context often has no deadline, and a sidecar that takes the stream but does not answer must
// not hold the Collector's shutdown.
const shutdownFlushTimeout = 5 * time.Second

// Reasons, the `reason` attribute of the failed and exited counters.
const (
	reasonRejected    = "rejected"
	reasonCapacity    = "capacity"
	reasonNoPID       = "no_pid"
	reasonGone        = "gone"
	reasonMismatch    = "mismatch"
	reasonInvalidUTF8 = "invalid_utf8"
	reasonRestarted   = "restarted"
	reasonExpired     = "expired"
)

// utf8WarnInterval is the least time between two WARNs about resources that are not UTF-8 (one
// per process: an unchanged resource is not looked at again); those in between go to DEBUG.
const utf8WarnInterval = time.Minute

// profilesExporter declares profiled processes to the sidecar. consumeProfiles only records
// (declarer.Client.Declare never waits); a sweeper goroutine releases processes that exited or
// were not profiled for expire_after.
type profilesExporter struct {
	cfg      *Config
	logger   *zap.Logger
	declarer string
	tb       *metadata.TelemetryBuilder
	now      func() time.Time
	tracker  *tracker
	// misses remembers profiles that could not be declared (gone, mismatch) for
	// exit_check_interval, so their repeats cost no procfs read.
	misses *misses
	// identity compares a profile with what proc_root shows under its pid.
	identity *procIdentity
	// flushTimeout bounds the flush at shutdown (shutdownFlushTimeout; tests shorten it).
	flushTimeout time.Duration

	// set by start, read by consumeProfiles and shutdown
	mu     sync.Mutex
	conn   *grpc.ClientConn
	client *declarer.Client
	stop   chan struct{}
	swept  chan struct{}

	noPID, gone, unchanged      atomic.Int64
	mismatch, invalidUTF8       atomic.Int64
	utf8WarnedAt                atomic.Int64 // unix ns of the last WARN about invalid UTF-8
	utf8Suppressed              atomic.Int64 // logged at DEBUG since
	exitedGone, exitedRestarted atomic.Int64
	exitedExpired               atomic.Int64
	warned                      sync.Map // log-once keys
	streamDown                  atomic.Bool
}

func newProfilesExporter(set exporter.Settings, cfg *Config) (*profilesExporter, error) {
	tb, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	name := cfg.Declarer
	if name == "" {
		name = set.ID.String()
	}
	return &profilesExporter{
		cfg:          cfg,
		logger:       set.Logger,
		declarer:     name,
		tb:           tb,
		now:          time.Now,
		tracker:      newTracker(),
		misses:       newMisses(cfg.MaxProcesses),
		identity:     newProcIdentity(cfg.ProcRoot),
		flushTimeout: shutdownFlushTimeout,
	}, nil
}

// start checks the token, dials the sidecar (lazily: a sidecar that is down is waited for, and
// declarations are held meanwhile), starts the declaration stream and the exit sweeper.
func (e *profilesExporter) start(ctx context.Context, _ component.Host) error {
	if _, err := e.token(); err != nil {
		return err
	}
	tlsCfg, err := sidecarconn.LoadTLS(ctx, e.cfg.Endpoint, e.cfg.TLS)
	if err != nil {
		return err
	}
	if tlsCfg == nil && (e.cfg.Token != "" || e.cfg.TokenFile != "") && !sidecarconn.IsLocal(e.cfg.Endpoint) {
		e.logger.Warn("A declare token is sent in plaintext to a non-loopback sidecar; set 'tls' to protect it",
			zap.String("endpoint", e.cfg.Endpoint))
	}
	if e.cfg.ProcRoot != "" {
		if _, err := declarer.StartTimeTicks(e.cfg.ProcRoot, 1); err != nil {
			e.logger.Warn("'proc_root' shows no process 1: start times and exits of profiled processes cannot be read there; "+
				"mount the profiler's (the host's) /proc and point 'proc_root' at it",
				zap.String("proc_root", e.cfg.ProcRoot), zap.Error(err))
		}
	}
	conn, err := sidecarconn.Dial(e.cfg.Endpoint, tlsCfg)
	if err != nil {
		return err
	}
	client, err := declarer.New(conn, declarer.Options{
		Name:         e.declarer,
		Token:        e.token,
		MaxProcesses: e.cfg.MaxProcesses,
		Observer:     (*streamObserver)(e),
	})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("'declarer': %w", err)
	}
	if err := e.registerTelemetry(client); err != nil {
		_ = conn.Close()
		return err
	}
	if err := client.Start(); err != nil {
		_ = conn.Close()
		return err
	}
	e.mu.Lock()
	e.conn, e.client = conn, client
	e.stop, e.swept = make(chan struct{}), make(chan struct{})
	e.mu.Unlock()
	go e.sweepLoop(e.stop, e.swept)
	return nil
}

// shutdown stops the sweeper, sends what is pending (until ctx ends, at most
// shutdownFlushTimeout) and closes the connection.
// It is safe without start. Declarations are not withdrawn: after a restart, this declarer's
// first resynchronisation replaces them.
func (e *profilesExporter) shutdown(ctx context.Context) error {
	e.mu.Lock()
	conn, client, stop, swept := e.conn, e.client, e.stop, e.swept
	e.conn, e.client, e.stop = nil, nil, nil
	e.mu.Unlock()
	e.tb.Shutdown()
	if client == nil {
		return nil
	}
	close(stop)
	<-swept
	ctx, cancel := context.WithTimeout(ctx, e.flushTimeout)
	defer cancel()
	if err := client.Close(ctx); err != nil {
		e.logger.Info("Shut down before every declaration reached the gpumetrics sidecar", zap.Error(err))
	}
	return conn.Close()
}

func (e *profilesExporter) token() (string, error) {
	return sidecarconn.Token(e.cfg.Token, e.cfg.TokenFile)
}

func (e *profilesExporter) currentClient() *declarer.Client {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.client
}

// consumeProfiles records each resource's process as its latest declaration: of several
// resources of one pid in the request, the one with the newest samples (newestPerProcess). It
// never waits on the sidecar and never fails: the profiles pipeline's other exporters are not
// held up by it.
func (e *profilesExporter) consumeProfiles(_ context.Context, pd pprofile.Profiles) error {
	client := e.currentClient()
	if client == nil {
		return nil
	}
	now := e.now()
	rps := pd.ResourceProfiles()
	for _, i := range newestPerProcess(rps) {
		rp := rps.At(i)
		e.declare(client, rp.Resource().Attributes(), rp.SchemaUrl(), now)
	}
	return nil
}

// declare records one resource's process. A process already declared with the same resource
// costs one hash and no procfs read: a pid reused since by a process with exactly the same
// resource is caught by the next sweep (its start time changed), within exit_check_interval.
// Before a new or changed resource is declared, proc_root must show the same process under its
// pid (procIdentity); a resource that could not be declared for that reason is not looked at
// again until it changes or exit_check_interval passes.
func (e *profilesExporter) declare(client *declarer.Client, attrs pcommon.Map, schemaURL string, now time.Time) {
	pid, ok := processPID(attrs)
	if !ok {
		e.noPID.Add(1)
		e.warnOnce(reasonNoPID, "A profile's resource has no int process.pid; it cannot be declared to the gpumetrics sidecar",
			zap.Any("resource", attrs.AsRaw()))
		return
	}
	fp := declarer.Fingerprint(declarer.Process{PID: pid, Resource: attrs, SchemaURL: schemaURL})
	if e.tracker.seenUnchanged(pid, fp, now) {
		e.unchanged.Add(1)
		return
	}
	if e.misses.recent(pid, fp, now) {
		return // counted and logged when it was first seen
	}
	var start uint64
	if e.cfg.ProcRoot != "" {
		s, err := declarer.StartTimeTicks(e.cfg.ProcRoot, pid)
		switch {
		case err == nil:
			start = s
		case errors.Is(err, fs.ErrNotExist):
			// Exited before its profile got here (or not in proc_root's pid namespace).
			e.gone.Add(1)
			e.misses.add(pid, fp, now, now.Add(e.cfg.ExitCheckInterval))
			e.warnOnce(reasonGone, "A profiled process is not in 'proc_root'; it is not declared (it exited, or 'proc_root' is not the profiler's pid namespace)",
				zap.Uint32("pid", pid), zap.String("proc_root", e.cfg.ProcRoot))
			return
		default:
			e.warnOnce("stat", "Cannot read a profiled process's start time; it is declared without one",
				zap.Uint32("pid", pid), zap.Error(err))
		}
		if diff, ok := e.identity.differs(pid, attrs, start, err == nil); ok {
			e.mismatch.Add(1)
			e.misses.add(pid, fp, now, now.Add(e.cfg.ExitCheckInterval))
			e.warnOnce(reasonMismatch, "A profiled pid is another process in 'proc_root'; it is not declared. "+
				"Likely cause: 'proc_root' is not the profiler's pid namespace (run the Collector in the host's pid namespace, "+
				"or mount the host's /proc and point 'proc_root' at it)",
				zap.Uint32("pid", pid), zap.String("proc_root", e.cfg.ProcRoot), zap.String("attribute", diff.key),
				zap.String("profile", diff.profile), zap.String("proc_root_value", diff.proc))
			return
		}
	}
	if !declarer.ValidUTF8(attrs) {
		// Declared with each invalid run replaced by U+FFFD (declarer.ToValidUTF8), the rule the
		// sidecar applies to its own procfs reads: an OTLP string must be UTF-8.
		e.invalidUTF8.Add(1)
		e.warnInvalidUTF8(pid, now)
	}
	_, err := client.Declare(declarer.Process{PID: pid, StartTimeTicks: start, Resource: attrs, SchemaURL: schemaURL, Environment: environment(attrs)})
	switch {
	case err == nil:
		e.misses.forget(pid)
		e.tracker.declared(pid, start, fp, now)
		if ce := e.logger.Check(zap.DebugLevel, "Declared a profiled process to the gpumetrics sidecar"); ce != nil {
			exe := ""
			if v, ok := attrs.Get(attrExecutablePath); ok {
				exe = v.AsString()
			}
			ce.Write(zap.Uint32("pid", pid), zap.Uint64("start_time_ticks", start), zap.String("executable", exe))
		}
	case errors.Is(err, declarer.ErrFull):
		e.warnOnce(reasonCapacity, "'max_processes' processes are declared; profiles of new processes are not declared until some exit",
			zap.Int("max_processes", e.cfg.MaxProcesses))
	case errors.Is(err, declarer.ErrClosed):
	default:
		e.warnOnce("encode", "A profile's resource cannot be declared", zap.Uint32("pid", pid), zap.Error(err))
	}
}

// sweepLoop runs sweep every exit_check_interval until stop is closed.
func (e *profilesExporter) sweepLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(e.cfg.ExitCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			e.sweep(e.currentClient(), e.now())
		}
	}
}

// sweep releases every held process that was not profiled for expire_after, whose pid is gone
// from proc_root, or whose pid now has another start time (the profiler reports no exits).
func (e *profilesExporter) sweep(client *declarer.Client, now time.Time) {
	if client == nil {
		return
	}
	for _, p := range e.tracker.snapshot() {
		reason := ""
		if now.Sub(p.seen) > e.cfg.ExpireAfter {
			reason = reasonExpired
		} else if e.cfg.ProcRoot != "" {
			start, err := declarer.StartTimeTicks(e.cfg.ProcRoot, p.pid)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				reason = reasonGone
			case err == nil && p.start != 0 && start != p.start:
				reason = reasonRestarted
			}
		}
		if reason == "" || !e.tracker.forget(p) {
			continue
		}
		client.Exit(p.pid, p.start)
		switch reason {
		case reasonExpired:
			e.exitedExpired.Add(1)
		case reasonGone:
			e.exitedGone.Add(1)
		case reasonRestarted:
			e.exitedRestarted.Add(1)
		}
		e.logger.Debug("Released a declared process", zap.Uint32("pid", p.pid), zap.String("reason", reason))
	}
}

// warnInvalidUTF8 logs a process whose resource is not UTF-8: at WARN at most once per
// utf8WarnInterval (naming how many were logged at DEBUG since), else at DEBUG.
func (e *profilesExporter) warnInvalidUTF8(pid uint32, now time.Time) {
	const msg = "A profile's resource has keys or string values that are not UTF-8; it is declared with each invalid run of bytes " +
		"replaced by U+FFFD, as the gpumetrics sidecar reads the same values from /proc"
	last := e.utf8WarnedAt.Load()
	if (last == 0 || now.UnixNano()-last >= int64(utf8WarnInterval)) && e.utf8WarnedAt.CompareAndSwap(last, now.UnixNano()) {
		e.logger.Warn(msg, zap.Uint32("pid", pid), zap.Int64("more_since_last_warning", e.utf8Suppressed.Swap(0)))
		return
	}
	e.utf8Suppressed.Add(1)
	e.logger.Debug(msg, zap.Uint32("pid", pid))
}

// warnOnce logs at WARN the first time key is seen, at DEBUG afterwards.
func (e *profilesExporter) warnOnce(key, msg string, fields ...zap.Field) {
	if _, seen := e.warned.LoadOrStore(key, struct{}{}); seen {
		e.logger.Debug(msg, fields...)
		return
	}
	e.logger.Warn(msg, fields...)
}

// registerTelemetry observes the client's and the exporter's counters at every collection.
func (e *profilesExporter) registerTelemetry(client *declarer.Client) error {
	b := e.tb
	reason := func(r string) metric.ObserveOption { return metric.WithAttributes(attribute.String("reason", r)) }
	return b.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := client.Stats()
		o.ObserveInt64(b.GpumetricsExporterProcessesDeclared, int64(s.Declared))                          //nolint:gosec // counts fit
		o.ObserveInt64(b.GpumetricsExporterProcessesUnchanged, int64(s.Unchanged)+e.unchanged.Load())     //nolint:gosec
		o.ObserveInt64(b.GpumetricsExporterDeclarationsFailed, int64(s.Rejected), reason(reasonRejected)) //nolint:gosec
		o.ObserveInt64(b.GpumetricsExporterDeclarationsFailed, int64(s.Full), reason(reasonCapacity))     //nolint:gosec
		o.ObserveInt64(b.GpumetricsExporterDeclarationsFailed, e.noPID.Load(), reason(reasonNoPID))
		o.ObserveInt64(b.GpumetricsExporterDeclarationsFailed, e.gone.Load(), reason(reasonGone))
		o.ObserveInt64(b.GpumetricsExporterDeclarationsFailed, e.mismatch.Load(), reason(reasonMismatch))
		o.ObserveInt64(b.GpumetricsExporterDeclarationsFailed, e.invalidUTF8.Load(), reason(reasonInvalidUTF8))
		o.ObserveInt64(b.GpumetricsExporterProcessesExited, e.exitedGone.Load(), reason(reasonGone))
		o.ObserveInt64(b.GpumetricsExporterProcessesExited, e.exitedRestarted.Load(), reason(reasonRestarted))
		o.ObserveInt64(b.GpumetricsExporterProcessesExited, e.exitedExpired.Load(), reason(reasonExpired))
		o.ObserveInt64(b.GpumetricsExporterProcesses, int64(s.Processes))
		o.ObserveInt64(b.GpumetricsExporterQueueSize, int64(s.Pending))
		o.ObserveInt64(b.GpumetricsExporterResyncs, int64(s.Resyncs))               //nolint:gosec
		o.ObserveInt64(b.GpumetricsExporterStreamFailures, int64(s.StreamFailures)) //nolint:gosec
		return nil
	}, b.GpumetricsExporterProcessesDeclared, b.GpumetricsExporterProcessesUnchanged, b.GpumetricsExporterDeclarationsFailed,
		b.GpumetricsExporterProcessesExited, b.GpumetricsExporterProcesses, b.GpumetricsExporterQueueSize,
		b.GpumetricsExporterResyncs, b.GpumetricsExporterStreamFailures)
}

// streamObserver logs the declaration stream's events (declarer.Observer).
type streamObserver profilesExporter

// indexPattern strips list indices from a rejected field, to log each kind of rejection once.
var indexPattern = regexp.MustCompile(`\[\d+\]`)

func (o *streamObserver) Resynced(declared int, released uint32) {
	o.streamDown.Store(false)
	o.logger.Info("Declared the profiled processes to the gpumetrics sidecar (resynchronised)",
		zap.Int("declared", declared), zap.Uint32("released", released), zap.String("declarer", o.declarer))
}

func (o *streamObserver) StreamFailed(err error) {
	if o.streamDown.Swap(true) {
		o.logger.Debug("The declaration stream to the gpumetrics sidecar is still down; retrying", zap.Error(err))
		return
	}
	o.logger.Warn("The declaration stream to the gpumetrics sidecar failed; declarations are held and resent once it is back",
		zap.String("endpoint", o.cfg.Endpoint), zap.Error(err))
}

func (o *streamObserver) Rejected(pid uint32, field, reason string) {
	(*profilesExporter)(o).warnOnce("rejected:"+indexPattern.ReplaceAllString(field, "[]"),
		"The gpumetrics sidecar rejected a declaration", zap.Uint32("pid", pid), zap.String("field", field), zap.String("reason", reason))
}
