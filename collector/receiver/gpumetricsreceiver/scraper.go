package gpumetricsreceiver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/scraper/scrapererror"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/internal/sidecarconn"
	imetadata "github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

const (
	// finalAckTimeout bounds the ack_only Pull sent at shutdown in remote mode.
	finalAckTimeout = 2 * time.Second
	// lostCheckTimeout bounds the health check that decides whether a subprocess is gone.
	lostCheckTimeout = 5 * time.Second
)

// errNoConnection is returned by a scrape when the sidecar could not be reached or started.
var errNoConnection = errors.New("no connection to the gpumetrics sidecar")

// pullScraper pulls OTLP batches from the sidecar. The scraper controller calls start, then
// scrape once per collection interval (never concurrently), then shutdown.
type pullScraper struct {
	cfg       *Config
	logger    *zap.Logger
	telemetry *imetadata.TelemetryBuilder
	consumer  string
	cursor    cursor

	// connect makes a new connection: a go-plugin subprocess or a gRPC client.
	connect func(ctx context.Context) (sidecar.Conn, error)
	// retry is how a Pull answered with UNAVAILABLE is retried within a scrape (retry.go,
	// `retry_on_failure`).
	retry pullRetry

	// stopped is cancelled when the receiver shuts down, ending an in-flight scrape at once
	// (the controller waits for it before it calls shutdown).
	stopped    context.Context
	stopScrape context.CancelFunc

	mu   sync.Mutex
	conn sidecar.Conn

	// unreachable counts the scrapes in a row that found nothing listening at the endpoint
	// (remote mode); the first is logged at WARN, the rest at DEBUG (noteReachability).
	unreachable int
	// logs is the logs signal's state when a logs receiver shares this scraper (logs.go).
	logs *logsPull
}

func newPullScraper(set receiver.Settings, cfg *Config) (*pullScraper, error) {
	tb, err := imetadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	s := &pullScraper{cfg: cfg, logger: set.Logger, telemetry: tb, consumer: cfg.Consumer, retry: newPullRetry(cfg.RetryOnFailure)}
	s.stopped, s.stopScrape = context.WithCancel(context.Background())
	if s.consumer == "" {
		s.consumer = set.ID.String()
	}
	if cfg.subprocessMode() {
		s.connect = s.startPlugin
	} else {
		s.connect = s.dialRemote
	}
	return s, nil
}

func (s *pullScraper) startPlugin(ctx context.Context) (sidecar.Conn, error) {
	return sidecar.StartPlugin(ctx, sidecar.PluginConfig{
		Command:      s.cfg.Command,
		Args:         s.cfg.Args,
		Env:          s.cfg.Env,
		StartTimeout: s.cfg.StartTimeout,
		Logger:       s.logger.Named("sidecar"),
	})
}

func (s *pullScraper) dialRemote(ctx context.Context) (sidecar.Conn, error) {
	// A unix socket is always plaintext: the sidecar serves no TLS there (Validate refuses TLS
	// settings with a unix endpoint).
	tlsCfg, err := sidecarconn.LoadTLS(ctx, s.cfg.Endpoint, s.cfg.TLS)
	if err != nil {
		return nil, err
	}
	if tlsCfg == nil && (s.cfg.Token != "" || s.cfg.TokenFile != "") && !sidecarconn.IsLocal(s.cfg.Endpoint) {
		s.logger.Warn("A bearer token is sent in plaintext to a non-loopback sidecar; set 'tls' to protect it",
			zap.String("endpoint", s.cfg.Endpoint))
	}
	return sidecar.DialRemote(sidecar.RemoteConfig{
		Target:         s.cfg.Endpoint,
		TLS:            tlsCfg,
		MaxRecvMsgSize: s.cfg.MaxRecvMsgSizeMiB << 20,
	})
}

// start checks the token file and makes the first connection. In subprocess mode a sidecar that
// cannot be started fails the Collector's start, with the reason; later losses are repaired by
// the next scrape.
func (s *pullScraper) start(ctx context.Context, _ component.Host) error {
	if _, err := s.token(); err != nil {
		return err
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.conn = conn
	s.mu.Unlock()
	return nil
}

// shutdown sends pending acknowledgements (remote mode: the sidecar outlives us) of the metrics
// and, when a logs receiver shares this scraper, the logs signal, then closes the connection,
// which stops a subprocess sidecar. It is safe without start.
func (s *pullScraper) shutdown(ctx context.Context) error {
	s.stopScrape()
	s.mu.Lock()
	conn := s.conn
	s.conn = nil
	logs := s.logs
	s.mu.Unlock()
	if conn == nil {
		return nil
	}
	s.finalAck(ctx, conn, &s.cursor, metricsSignal(pmetric.NewMetrics()))
	if logs != nil {
		logs.stopScrape()
		s.finalAck(ctx, conn, &logs.cursor, logs.signal(plog.NewLogs(), s))
	}
	return conn.Close(ctx)
}

// finalAckNow is finalAck on the current connection, when there is one.
func (s *pullScraper) finalAckNow(ctx context.Context, cur *cursor, sig signal) {
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	if conn != nil {
		s.finalAck(ctx, conn, cur, sig)
	}
}

// finalAck sends cur's unsent acknowledgement in an ack_only Pull (remote mode only: a
// subprocess sidecar stops with us and forgets its store).
func (s *pullScraper) finalAck(ctx context.Context, conn sidecar.Conn, cur *cursor, sig signal) {
	if s.cfg.subprocessMode() || !cur.hasUnsentAck() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, finalAckTimeout)
	defer cancel()
	ctx, err := s.withToken(ctx)
	if err == nil {
		req := cur.request(s.consumer, 0, 0, 0, true)
		var resp *pullAnswer
		if resp, err = sig.pull(ctx, conn, req); err == nil {
			cur.delivered(req)
			s.reportDrops(ctx, resp, sig)
			return
		}
	}
	s.logger.Info("Could not send the final acknowledgement; the sidecar will re-deliver the last batches",
		zap.String("signal", sig.name), zap.Error(err))
}

// token returns the bearer token ("" when none is configured), reading token_file afresh.
func (s *pullScraper) token() (string, error) {
	return sidecarconn.Token(s.cfg.Token, s.cfg.TokenFile)
}

func (s *pullScraper) withToken(ctx context.Context) (context.Context, error) {
	tok, err := s.token()
	if err != nil || tok == "" {
		return ctx, err
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), nil
}

// connection returns the current connection, making a new one when there is none (a subprocess
// that was lost, or a start that failed).
func (s *pullScraper) connection(ctx context.Context) (sidecar.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		return s.conn, nil
	}
	s.logger.Info("Starting a new connection to the gpumetrics sidecar")
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoConnection, err)
	}
	s.conn = conn
	return conn, nil
}

// dropIfLost closes conn after a failed Pull when it cannot recover by itself (a subprocess that
// exited or stopped answering), so the next scrape starts a new one, and reports whether it did.
// The check gets its own deadline: the scrape's may be spent by the Pull that failed; stopped is
// the pulling signal's shutdown.
func (s *pullScraper) dropIfLost(stopped context.Context, conn sidecar.Conn) bool {
	ctx, cancel := context.WithTimeout(stopped, lostCheckTimeout)
	defer cancel()
	if !conn.Lost(ctx) {
		return false
	}
	s.logger.Warn("The gpumetrics sidecar process is gone; a new one is started at the next scrape")
	s.mu.Lock()
	if s.conn == conn {
		s.conn = nil
	}
	s.mu.Unlock()
	if err := conn.Close(ctx); err != nil {
		s.logger.Debug("Closing the lost sidecar", zap.Error(err))
	}
	return true
}

// scrape reads the sidecar's backlog and returns it as one pmetric.Metrics. It starts reading
// right after what the pipeline accepted (so batches the pipeline refused are read again) and
// pulls with read_after_sequence advancing through the answers until the sidecar says there is
// no more, at most max_pulls_per_scrape times; nothing is acknowledged meanwhile. What it returns
// is recorded as pending and settled by ackingConsumer once the pipeline answered. A Pull
// answered with UNAVAILABLE (a sidecar starting or restarting) is retried within the scrape
// (pullRetrying). A Pull that fails for good after earlier ones succeeded gives a partial scrape
// error, so the data already pulled still reaches the pipeline.
func (s *pullScraper) scrape(ctx context.Context) (pmetric.Metrics, error) {
	md := pmetric.NewMetrics()
	err := s.pullBacklog(ctx, s.stopped, &s.cursor, metricsSignal(md))
	return md, err
}

// pullAnswer is one Pull's answer, whatever the signal (PullResponse or PullLogsResponse).
type pullAnswer struct {
	epoch                 string
	first, last           uint64
	more                  bool
	items                 uint64 // data points or log records in payload
	payload               []byte // a serialized ExportMetricsServiceRequest or ExportLogsServiceRequest
	dropped, droppedTotal uint64
	reasons               []string
}

// signal is what differs between pulling metrics and pulling logs: the RPC, the decoding into
// the scrape's data, and what the items are called.
type signal struct {
	// name is "metrics" or "logs", for log messages.
	name string
	// items names what the store counts ("data points", "log records"); key is the same as a
	// log field ("data_points", "log_records").
	items, key string
	// pull sends req (as the signal's request type) on conn.
	pull func(ctx context.Context, conn sidecar.Conn, req *gpumetricsv1.PullRequest) (*pullAnswer, error)
	// decode moves the payload's resources into the scrape's data.
	decode func(payload []byte) error
	// count returns the items handed to the pipeline so far.
	count func() int64
	// dropped counts items the sidecar dropped before this receiver acknowledged them (nil:
	// the data-point counter).
	dropped func(ctx context.Context, n int64)
	// restarted is logged when the store's epoch changes; the metric store's epoch changes
	// count as sidecar restarts (otelcol_gpumetrics_sidecar_restarts), the log store's do not
	// (one restart changes both).
	restarted     string
	countRestarts bool
}

// metricsSignal pulls MetricsPullService/Pull into md.
func metricsSignal(md pmetric.Metrics) signal {
	return signal{
		name:          "metrics",
		items:         "data points",
		key:           "data_points",
		restarted:     "The gpumetrics sidecar restarted (new store epoch); acknowledgement cursor reset",
		countRestarts: true,
		pull: func(ctx context.Context, conn sidecar.Conn, req *gpumetricsv1.PullRequest) (*pullAnswer, error) {
			r, err := conn.Pull(ctx, req)
			if err != nil {
				return nil, err
			}
			return &pullAnswer{
				epoch: r.GetEpoch(), first: r.GetFirstSequence(), last: r.GetLastSequence(),
				more: r.GetMore(), items: r.GetDataPoints(), payload: r.GetExportMetricsServiceRequest(),
				dropped: r.GetDroppedDataPoints(), droppedTotal: r.GetDroppedDataPointsTotal(),
				reasons: r.GetDropReasons(),
			}, nil
		},
		decode: func(b []byte) error { return appendOTLP(md, b) },
		count:  func() int64 { return int64(md.DataPointCount()) },
	}
}

// pullBacklog is the scrape loop of both signals (see scrape). stopped ends it at shutdown.
func (s *pullScraper) pullBacklog(ctx, stopped context.Context, cur *cursor, sig signal) error {
	budget := s.retry.newBudget(ctx, s.cfg.Timeout)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(stopped, cancel)()
	ctx, err := s.withToken(ctx)
	if err != nil {
		return err
	}
	conn, err := s.connection(ctx)
	if err != nil {
		return err
	}
	var (
		d        *delivery // what this scrape collected so far
		decodeEs []error
		pullErr  error
		more     bool
	)
	readAfter := cur.readStart()
	for range s.cfg.MaxPullsPerScrape {
		req := cur.request(s.consumer, readAfter, s.cfg.MaxDataPointsPerPull, s.cfg.MaxBytesPerPull, false)
		resp, err := s.pullRetrying(ctx, stopped, conn, req, budget, sig)
		if err != nil {
			pullErr = budget.wrap(err, s.retry.now())
			break
		}
		cur.delivered(req)
		if old, restarted := cur.observeEpoch(resp.epoch); restarted {
			s.logger.Info(sig.restarted,
				zap.String("signal", sig.name), zap.String("old_epoch", old), zap.String("epoch", resp.epoch))
			if sig.countRestarts {
				s.telemetry.GpumetricsSidecarRestarts.Add(ctx, 1)
			}
		}
		s.reportDrops(ctx, resp, sig)
		if d != nil && d.epoch != resp.epoch {
			// Restarted between two pulls of this scrape: the older data is still handed on,
			// but only the new epoch can be acknowledged.
			d = &delivery{epoch: resp.epoch, rejected: d.rejected, rejectReason: d.rejectReason}
		}
		more = resp.more
		if resp.last == 0 {
			break // nothing after the read position
		}
		if d == nil {
			d = &delivery{epoch: resp.epoch}
		}
		d.lastSequence = resp.last
		readAfter = resp.last
		if err := sig.decode(resp.payload); err != nil {
			decodeEs = append(decodeEs, fmt.Errorf("batches %d..%d: %w", resp.first, resp.last, err))
			d.rejected += int64(resp.items) //nolint:gosec // counts are far below 2^63
		}
		if !more {
			break
		}
	}
	s.noteReachability(pullErr)
	if pullErr == nil && budget.retries > 0 {
		s.logger.Debug("The gpumetrics sidecar answered after retries within the scrape",
			zap.String("signal", sig.name), zap.Int("retries", budget.retries),
			zap.Duration("elapsed", s.retry.now().Sub(budget.start)))
	}
	if pullErr == nil && more {
		s.logger.Debug("Backlog left for the next scrape after max_pulls_per_scrape pulls",
			zap.String("signal", sig.name), zap.Int("max_pulls_per_scrape", s.cfg.MaxPullsPerScrape),
			zap.Uint64("read_up_to", readAfter))
	}
	if d != nil {
		d.points = sig.count()
		if len(decodeEs) > 0 {
			d.rejectReason = errors.Join(decodeEs...).Error()
		}
		cur.setPending(d)
	}
	return scrapeError(d, pullErr, decodeEs)
}

// noteReachability logs an unreachable sidecar once per outage: one WARN naming the endpoint, the
// dial error and when the next try is (the next scrape; each scrape also retries within its
// budget), DEBUG for every further failed scrape, and one INFO when a Pull gets through again.
// gRPC itself is not asked to connect meanwhile (sidecar.Remote), so this is the only line.
func (s *pullScraper) noteReachability(pullErr error) {
	var down *sidecar.UnreachableError
	if errors.As(pullErr, &down) {
		log := s.logger.Debug
		if s.unreachable == 0 {
			log = s.logger.Warn
		}
		s.unreachable++
		log("The gpumetrics sidecar is unreachable; the receiver tries again at every scrape",
			zap.String("endpoint", down.Endpoint), zap.String("error", down.Err.Error()),
			zap.Duration("next_retry_in", s.cfg.CollectionInterval), zap.Int("failed_scrapes", s.unreachable))
		return
	}
	if pullErr == nil && s.unreachable > 0 {
		s.logger.Info("The gpumetrics sidecar is reachable again",
			zap.String("endpoint", s.cfg.Endpoint), zap.Int("failed_scrapes", s.unreachable))
		s.unreachable = 0
	}
}

// scrapeError turns the scrape's failures into the controller's terms: nothing pulled and a
// failed Pull is a plain error (the controller drops the scrape); otherwise a partial scrape
// error, so the data that was pulled still reaches the pipeline.
func scrapeError(d *delivery, pullErr error, decodeEs []error) error {
	if pullErr == nil && len(decodeEs) == 0 {
		return nil
	}
	if d == nil {
		return pullErr
	}
	return scrapererror.NewPartialScrapeError(errors.Join(append(decodeEs, pullErr)...), int(d.rejected))
}

// appendOTLP decodes a serialized ExportMetricsServiceRequest (or MetricsData: same wire format)
// and moves its resources into md. Empty bytes add nothing.
func appendOTLP(md pmetric.Metrics, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	req := pmetricotlp.NewExportRequest()
	if err := req.UnmarshalProto(b); err != nil {
		return fmt.Errorf("decoding export_metrics_service_request: %w", err)
	}
	req.Metrics().ResourceMetrics().MoveAndAppendTo(md.ResourceMetrics())
	return nil
}

// reportDrops logs and counts the items the sidecar says this consumer lost.
func (s *pullScraper) reportDrops(ctx context.Context, resp *pullAnswer, sig signal) {
	n := resp.dropped
	if n == 0 {
		return
	}
	s.logger.Warn("The gpumetrics sidecar dropped "+sig.items+" before this receiver acknowledged them",
		zap.String("signal", sig.name),
		zap.Uint64("dropped_"+sig.key, n),
		zap.Uint64("dropped_"+sig.key+"_total", resp.droppedTotal),
		zap.Strings("reasons", resp.reasons),
		zap.String("consumer", s.consumer))
	if sig.dropped != nil {
		sig.dropped(ctx, int64(n)) //nolint:gosec // counts are far below 2^63
		return
	}
	s.telemetry.GpumetricsSidecarDroppedDataPoints.Add(ctx, int64(n)) //nolint:gosec // counts are far below 2^63
}
