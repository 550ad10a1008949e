package gpumetricsreceiver

import (
	"context"
	"fmt"
	"sync/atomic"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/scraper"
	"go.opentelemetry.io/collector/scraper/scraperhelper"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

// The logs signal: the sidecar's GPU events (Xid, ECC, row remapping, recovery actions, a lost
// GPU) as OTLP log records, pulled from gpumetrics.v1.LogsPullService with the same scrape loop,
// retry and acknowledgement rules as the metrics (docs/protocol.md), on the metrics receiver's
// connection when both pipelines use the receiver (shared.go). The log store has its own epoch
// and sequences, so the logs signal keeps its own cursor.

// logsPull is the logs signal's state on a shared pullScraper.
type logsPull struct {
	cursor cursor
	// stopped ends an in-flight logs scrape at shutdown (the metrics signal has its own).
	stopped    context.Context
	stopScrape context.CancelFunc
	// unimplemented is set once a sidecar answered UNIMPLEMENTED (no GPU events: older, or
	// events disabled); it is logged once, not as a scrape error every interval.
	unimplemented atomic.Bool
}

func newLogsPull() *logsPull {
	l := &logsPull{}
	l.stopped, l.stopScrape = context.WithCancel(context.Background())
	return l
}

// signal pulls LogsPullService/PullLogs into ld. The PullRequest the cursor builds maps field
// for field onto PullLogsRequest (data points are log records there).
func (l *logsPull) signal(ld plog.Logs, s *pullScraper) signal {
	return signal{
		name:      "logs",
		items:     "log records",
		key:       "log_records",
		restarted: "The gpumetrics sidecar's log store has a new epoch (the sidecar restarted); logs acknowledgement cursor reset",
		pull: func(ctx context.Context, conn sidecar.Conn, req *gpumetricsv1.PullRequest) (*pullAnswer, error) {
			r, err := conn.PullLogs(ctx, logsRequest(req))
			if err != nil {
				return nil, err
			}
			return &pullAnswer{
				epoch: r.GetEpoch(), first: r.GetFirstSequence(), last: r.GetLastSequence(),
				more: r.GetMore(), items: r.GetLogRecords(), payload: r.GetExportLogsServiceRequest(),
				dropped: r.GetDroppedLogRecords(), droppedTotal: r.GetDroppedLogRecordsTotal(),
				reasons: r.GetDropReasons(),
			}, nil
		},
		decode: func(b []byte) error { return appendOTLPLogs(ld, b) },
		count:  func() int64 { return int64(ld.LogRecordCount()) },
		dropped: func(ctx context.Context, n int64) {
			s.telemetry.GpumetricsSidecarDroppedLogRecords.Add(ctx, n)
		},
	}
}

// logsRequest is req as a PullLogsRequest.
func logsRequest(req *gpumetricsv1.PullRequest) *gpumetricsv1.PullLogsRequest {
	out := &gpumetricsv1.PullLogsRequest{
		Consumer:          req.GetConsumer(),
		AckSequence:       req.GetAckSequence(),
		AckEpoch:          req.GetAckEpoch(),
		MaxLogRecords:     req.GetMaxDataPoints(),
		MaxBytes:          req.GetMaxBytes(),
		AckOnly:           req.GetAckOnly(),
		ReadAfterSequence: req.GetReadAfterSequence(),
	}
	if o := req.GetPreviousOutcome(); o != nil {
		out.PreviousOutcome = &gpumetricsv1.LogsPreviousOutcome{
			LastSequence:       o.GetLastSequence(),
			RejectedLogRecords: o.GetRejectedDataPoints(),
			ErrorMessage:       o.GetErrorMessage(),
		}
	}
	return out
}

// appendOTLPLogs decodes a serialized ExportLogsServiceRequest and moves its resources into ld.
// Empty bytes add nothing.
func appendOTLPLogs(ld plog.Logs, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	req := plogotlp.NewExportRequest()
	if err := req.UnmarshalProto(b); err != nil {
		return fmt.Errorf("decoding export_logs_service_request: %w", err)
	}
	req.Logs().ResourceLogs().MoveAndAppendTo(ld.ResourceLogs())
	return nil
}

// logsScraper is the scraper of the logs receiver: the shared pullScraper's connection with the
// logs signal's cursor.
type logsScraper struct {
	s    *pullScraper
	logs *logsPull
}

// attachLogs returns the logs state of s, creating it for the first logs receiver of s.
func attachLogs(s *pullScraper) *logsPull {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		s.logs = newLogsPull()
	}
	return s.logs
}

// scrape reads the log store's backlog (the metrics scrape's loop, scraper.go). A sidecar
// without the logs service answers UNIMPLEMENTED: logged once, an empty scrape.
func (l *logsScraper) scrape(ctx context.Context) (plog.Logs, error) {
	ld := plog.NewLogs()
	err := l.s.pullBacklog(ctx, l.logs.stopped, &l.logs.cursor, l.logs.signal(ld, l.s))
	if isUnimplemented(err) {
		if !l.logs.unimplemented.Swap(true) {
			l.s.logger.Warn("The gpumetrics sidecar serves no GPU events (LogsPullService is unimplemented: an older sidecar, or events.enabled is false); the logs pipeline gets nothing from it",
				zap.Error(err))
		}
		return ld, nil
	}
	return ld, err
}

// isUnimplemented reports whether err wraps a gRPC UNIMPLEMENTED status (budget.wrap wraps it).
func isUnimplemented(err error) bool {
	for err != nil {
		if st, ok := status.FromError(err); ok && st.Code() == codes.Unimplemented {
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// finalAck sends the logs signal's pending acknowledgement on the current connection.
func (l *logsScraper) finalAck(ctx context.Context) {
	l.s.finalAckNow(ctx, &l.logs.cursor, l.logs.signal(plog.NewLogs(), l.s))
}

// newLogsReceiver builds the logs scraper on cfg's shared pullScraper and a scraper controller
// whose consumer acknowledges a batch only once next (the logs pipeline) accepted it. options
// are passed to the controller after these (tests drive scrapes with WithTickerChannel).
func newLogsReceiver(set receiver.Settings, cfg *Config, next consumer.Logs, options ...scraperhelper.ControllerOption) (receiver.Logs, error) {
	l, err := acquireScraper(set, cfg)
	if err != nil {
		return nil, err
	}
	ls := &logsScraper{s: l.shared.s, logs: attachLogs(l.shared.s)}
	sc, err := scraper.NewLogs(ls.scrape, scraper.WithStart(l.start),
		scraper.WithShutdown(func(ctx context.Context) error { return l.shutdown(ctx, ls.finalAck) }))
	if err != nil {
		return nil, err
	}
	options = append([]scraperhelper.ControllerOption{
		scraperhelper.AddFactoryWithConfig(scraper.NewFactory(metadata.Type, nil,
			scraper.WithLogs(func(context.Context, scraper.Settings, component.Config) (scraper.Logs, error) {
				return sc, nil
			}, metadata.LogsStability)), nil),
	}, options...)
	controller, err := scraperhelper.NewLogsController(&cfg.ControllerConfig, set, &ackingLogsConsumer{next: next, scraper: ls}, options...)
	if err != nil {
		return nil, err
	}
	return &logsReceiver{Logs: controller, scraper: ls}, nil
}

// logsReceiver is the logs scraper controller, with a Shutdown that first ends an in-flight
// logs scrape.
type logsReceiver struct {
	receiver.Logs
	scraper *logsScraper
}

// Shutdown ends any in-flight logs scrape, then shuts the controller and the lease down.
func (r *logsReceiver) Shutdown(ctx context.Context) error {
	r.scraper.logs.stopScrape()
	return r.Logs.Shutdown(ctx)
}

// ackingLogsConsumer forwards each logs scrape's records to next and settles the scrape's
// delivery with next's verdict, as ackingConsumer does for metrics.
type ackingLogsConsumer struct {
	next    consumer.Logs
	scraper *logsScraper
}

var _ consumer.Logs = (*ackingLogsConsumer)(nil)

// Capabilities are next's.
func (a *ackingLogsConsumer) Capabilities() consumer.Capabilities { return a.next.Capabilities() }

// ConsumeLogs hands ld to next (not when empty: the controller calls after every scrape), then
// acknowledges (or not) what the scrape pulled.
func (a *ackingLogsConsumer) ConsumeLogs(ctx context.Context, ld plog.Logs) error {
	d := a.scraper.logs.cursor.takePending()
	var err error
	if ld.ResourceLogs().Len() > 0 {
		err = a.next.ConsumeLogs(ctx, ld)
	}
	settle(a.scraper.s.logger.With(zap.String("signal", "logs")), &a.scraper.logs.cursor, d, err, "log_records")
	return err
}
