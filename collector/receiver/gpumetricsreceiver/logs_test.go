package gpumetricsreceiver

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/scraper/scraperhelper"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

// serveBoth serves the fake metrics and (when logs is not nil) logs services on 127.0.0.1:0.
func serveBoth(t *testing.T, fake *fakesidecar.Server, logs *fakesidecar.LogsServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(fakesidecar.TrackDeliveries())
	gpumetricsv1.RegisterMetricsPullServiceServer(srv, fake)
	if logs != nil {
		gpumetricsv1.RegisterLogsPullServiceServer(srv, logs)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("fake sidecar: %v", err)
		}
	})
	return lis.Addr().String()
}

// scriptedLogs answers ConsumeLogs with the next scripted error and keeps what it accepted.
type scriptedLogs struct {
	mu       sync.Mutex
	script   []error
	accepted []plog.Logs
}

func (c *scriptedLogs) Capabilities() consumer.Capabilities { return consumer.Capabilities{} }

func (c *scriptedLogs) ConsumeLogs(_ context.Context, ld plog.Logs) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	if len(c.script) > 0 {
		err, c.script = c.script[0], c.script[1:]
	}
	if err == nil {
		cp := plog.NewLogs()
		ld.CopyTo(cp)
		c.accepted = append(c.accepted, cp)
	}
	return err
}

// batches returns the "batch" resource attribute of every resource accepted, in order.
func (c *scriptedLogs) batches() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, ld := range c.accepted {
		for i := range ld.ResourceLogs().Len() {
			v, _ := ld.ResourceLogs().At(i).Resource().Attributes().Get("batch")
			out = append(out, v.AsString())
		}
	}
	return out
}

// logsFor builds the logs scraper of cfg on a started shared scraper (released at the end).
func logsFor(t *testing.T, env *testEnv, cfg *Config) *logsScraper {
	t.Helper()
	require.NoError(t, cfg.Validate())
	l, err := acquireScraper(env.set, cfg)
	require.NoError(t, err)
	require.NoError(t, l.start(context.Background(), componenttest.NewNopHost()))
	ls := &logsScraper{s: l.shared.s, logs: attachLogs(l.shared.s)}
	t.Cleanup(func() { require.NoError(t, l.shutdown(context.Background(), ls.finalAck)) })
	return ls
}

// logsCycle is one logs scrape handed to next through the acknowledging consumer.
func logsCycle(ls *logsScraper, next consumer.Logs) (scrapeErr, consumeErr error) {
	ld, scrapeErr := ls.scrape(context.Background())
	consumeErr = (&ackingLogsConsumer{next: next, scraper: ls}).ConsumeLogs(context.Background(), ld)
	return scrapeErr, consumeErr
}

func TestLogsArePulledAndAcknowledgedOnlyAfterThePipelineAccepted(t *testing.T) {
	fake, logs := fakesidecar.New(fakesidecar.Options{}), fakesidecar.NewLogs(fakesidecar.Options{Epoch: "logs-1"})
	logs.AppendLogs(fakesidecar.Event("e1", 2))
	logs.AppendLogs(fakesidecar.Event("e2", 1))
	env := newTestEnv(t)
	ls := logsFor(t, env, remoteConfig(serveBoth(t, fake, logs)))

	refusing := &scriptedLogs{script: []error{errors.New("exporter queue full")}}
	scrapeErr, consumeErr := logsCycle(ls, refusing)
	require.NoError(t, scrapeErr)
	require.Error(t, consumeErr)
	assert.Equal(t, uint64(0), logs.Store.Acked(env.set.ID.String()), "refused: not acknowledged")

	next := &scriptedLogs{}
	scrapeErr, consumeErr = logsCycle(ls, next)
	require.NoError(t, scrapeErr)
	require.NoError(t, consumeErr)
	assert.Equal(t, []string{"e1", "e2"}, next.batches(), "the refused batches again, in order")
	reqs := logs.Store.Requests()
	require.Len(t, reqs, 2)
	outcome := reqs[1].GetPreviousOutcome()
	require.NotNil(t, outcome, "the refusal is reported in the next PullLogs")
	assert.Equal(t, int64(3), outcome.GetRejectedDataPoints(), "log records rejected")
	assert.Contains(t, outcome.GetErrorMessage(), "exporter queue full")

	_, _ = logsCycle(ls, next) // carries the acknowledgement
	assert.Equal(t, uint64(2), logs.Store.Acked(env.set.ID.String()))
	assert.Equal(t, 0, logs.Store.Held())
	assert.Empty(t, fake.Requests(), "the logs signal never pulls metrics")
}

func TestLogsAnEmptyLogStoreIsAnEmptyScrape(t *testing.T) {
	logs := fakesidecar.NewLogs(fakesidecar.Options{})
	env := newTestEnv(t)
	ls := logsFor(t, env, remoteConfig(serveBoth(t, fakesidecar.New(fakesidecar.Options{}), logs)))
	next := &scriptedLogs{}
	scrapeErr, consumeErr := logsCycle(ls, next)
	require.NoError(t, scrapeErr)
	require.NoError(t, consumeErr)
	assert.Empty(t, next.accepted, "nothing forwarded")
}

func TestLogsFromASidecarWithoutEventsAreLoggedOnce(t *testing.T) {
	env := newTestEnv(t)
	ls := logsFor(t, env, remoteConfig(serveBoth(t, fakesidecar.New(fakesidecar.Options{}), nil)))
	for range 3 {
		scrapeErr, consumeErr := logsCycle(ls, &scriptedLogs{})
		require.NoError(t, scrapeErr, "UNIMPLEMENTED is not a scrape error")
		require.NoError(t, consumeErr)
	}
	warned := env.logs.FilterMessageSnippet("serves no GPU events").FilterLevelExact(zapcore.WarnLevel)
	assert.Equal(t, 1, warned.Len())
}

func TestLogsDropsAreReportedAsLogRecords(t *testing.T) {
	logs := fakesidecar.NewLogs(fakesidecar.Options{})
	logs.AppendLogs(fakesidecar.Event("e1", 1))
	logs.Store.Drop(5, "max_log_records")
	env := newTestEnv(t)
	ls := logsFor(t, env, remoteConfig(serveBoth(t, fakesidecar.New(fakesidecar.Options{}), logs)))
	_, _ = logsCycle(ls, &scriptedLogs{})
	drops := env.logs.FilterMessageSnippet("dropped log records").FilterLevelExact(zapcore.WarnLevel)
	require.Equal(t, 1, drops.Len())
	assert.Equal(t, uint64(5), drops.All()[0].ContextMap()["dropped_log_records"])
	assert.Equal(t, int64(5), env.counter(t, "otelcol_gpumetrics_sidecar_dropped_log_records"))
	assert.Equal(t, int64(0), env.counter(t, "otelcol_gpumetrics_sidecar_dropped_data_points"))
}

func TestLogsRetryUnavailableWithinTheScrape(t *testing.T) {
	logs := fakesidecar.NewLogs(fakesidecar.Options{})
	logs.AppendLogs(fakesidecar.Event("e1", 1))
	logs.Store.FailRequest(1, status.Error(codes.Unavailable, "restarting"))
	env := newTestEnv(t)
	ls := logsFor(t, env, remoteConfig(serveBoth(t, fakesidecar.New(fakesidecar.Options{}), logs)))
	ls.s.retry.wait = func(context.Context, time.Duration) error { return nil }
	next := &scriptedLogs{}
	scrapeErr, _ := logsCycle(ls, next)
	require.NoError(t, scrapeErr)
	assert.Equal(t, []string{"e1"}, next.batches())
}

// bothSignals is the receiver of one *Config in a metrics and a logs pipeline, each driven by
// its own ticker channel.
type bothSignals struct {
	mr                    receiver.Metrics
	lr                    receiver.Logs
	metricsTick, logsTick chan time.Time
	metricsNext           *scriptedConsumer
	logsNext              *consumertest.LogsSink
}

func newBothSignals(t *testing.T, env *testEnv, cfg *Config) bothSignals {
	t.Helper()
	b := bothSignals{
		metricsTick: make(chan time.Time), logsTick: make(chan time.Time),
		metricsNext: newScriptedConsumer(), logsNext: new(consumertest.LogsSink),
	}
	var err error
	b.mr, err = newMetricsReceiver(env.set, cfg, b.metricsNext, scraperhelper.WithTickerChannel(b.metricsTick))
	require.NoError(t, err)
	b.lr, err = newLogsReceiver(env.set, cfg, b.logsNext, scraperhelper.WithTickerChannel(b.logsTick))
	require.NoError(t, err)
	return b
}

// TestLogsAndMetricsShareOneSidecar: the receiver in a metrics and a logs pipeline is two
// receivers of one *Config; they use one connection, the first Start connects, and the
// connection outlives the first Shutdown.
func TestLogsAndMetricsShareOneSidecar(t *testing.T) {
	fake, logs := fakesidecar.New(fakesidecar.Options{}), fakesidecar.NewLogs(fakesidecar.Options{})
	appendBatches(fake, 1, 1)
	logs.AppendLogs(fakesidecar.Event("e1", 1))
	cfg := remoteConfig(serveBoth(t, fake, logs))
	env := newTestEnv(t)
	b := newBothSignals(t, env, cfg)
	shared := b.mr.(*metricsReceiver).scraper
	assert.Same(t, shared, b.lr.(*logsReceiver).scraper.s, "one pullScraper per *Config")

	connects := 0
	connect := shared.connect
	shared.connect = func(ctx context.Context) (sidecar.Conn, error) {
		connects++
		return connect(ctx)
	}
	host := componenttest.NewNopHost()
	require.NoError(t, b.mr.Start(context.Background(), host))
	require.NoError(t, b.lr.Start(context.Background(), host))
	assert.Equal(t, 1, connects)

	require.NoError(t, b.mr.Shutdown(context.Background()))
	b.logsTick <- time.Now()
	require.Eventually(t, func() bool { return b.logsNext.LogRecordCount() == 1 }, 30*time.Second, 10*time.Millisecond,
		"the logs receiver still pulls after the metrics receiver shut down")
	require.NoError(t, b.lr.Shutdown(context.Background()))
	shared.mu.Lock()
	assert.Nil(t, shared.conn, "the last Shutdown closes the connection")
	shared.mu.Unlock()
	sharedScrapers.mu.Lock()
	_, held := sharedScrapers.m[cfg]
	sharedScrapers.mu.Unlock()
	assert.False(t, held, "the registry forgets the configuration")
}

func TestLogsFinalAcknowledgementAtShutdown(t *testing.T) {
	logs := fakesidecar.NewLogs(fakesidecar.Options{})
	logs.AppendLogs(fakesidecar.Event("e1", 1))
	cfg := remoteConfig(serveBoth(t, fakesidecar.New(fakesidecar.Options{}), logs))
	env := newTestEnv(t)
	l, err := acquireScraper(env.set, cfg)
	require.NoError(t, err)
	require.NoError(t, l.start(context.Background(), componenttest.NewNopHost()))
	ls := &logsScraper{s: l.shared.s, logs: attachLogs(l.shared.s)}
	_, _ = logsCycle(ls, &scriptedLogs{})
	require.NoError(t, l.shutdown(context.Background(), ls.finalAck))
	reqs := logs.Store.Requests()
	require.Len(t, reqs, 2)
	assert.True(t, reqs[1].GetAckOnly())
	assert.Equal(t, uint64(1), reqs[1].GetAckSequence())
	assert.Equal(t, 0, logs.Store.Held())
}

func TestFactoryCreatesLogsReceivers(t *testing.T) {
	f := NewFactory()
	assert.Equal(t, metadata.LogsStability, f.LogsStability())
	cfg := f.CreateDefaultConfig().(*Config)
	cfg.Endpoint = "127.0.0.1:1"
	rcv, err := f.CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, rcv.Shutdown(context.Background()), "shutdown without start")
	_, err = f.CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), struct{}{}, consumertest.NewNop())
	require.ErrorIs(t, err, errConfigType)
	var _ receiver.Logs = rcv
}

// TestLogsAndMetricsFromOneSubprocess: both signals of one configuration in subprocess mode
// start one plugin process and read its metric and log stores.
func TestLogsAndMetricsFromOneSubprocess(t *testing.T) {
	cfg := subprocessConfig(t)
	env := newTestEnv(t)
	b := newBothSignals(t, env, cfg)
	host := componenttest.NewNopHost()
	require.NoError(t, b.mr.Start(context.Background(), host))
	require.NoError(t, b.lr.Start(context.Background(), host))
	b.metricsTick <- time.Now()
	b.metricsNext.waitCall(t)
	b.logsTick <- time.Now()
	require.Eventually(t, func() bool { return b.logsNext.LogRecordCount() == 2 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, b.lr.Shutdown(context.Background()))
	require.NoError(t, b.mr.Shutdown(context.Background()))

	pids := b.metricsNext.pluginPids()
	require.NotEmpty(t, pids)
	logPid, _ := b.logsNext.AllLogs()[0].ResourceLogs().At(0).Resource().Attributes().Get("process.pid")
	assert.Equal(t, pids[0], logPid.Int(), "the logs came from the same plugin process")
	assert.Equal(t, 1, env.logs.FilterMessageSnippet("Started the gpumetrics sidecar").Len(), "one subprocess")
	assert.ErrorIs(t, unix.Kill(int(pids[0]), 0), unix.ESRCH, "the last Shutdown stopped the plugin")
}
