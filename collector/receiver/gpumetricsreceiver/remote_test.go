package gpumetricsreceiver

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/scraper/scrapererror"
	"go.opentelemetry.io/collector/scraper/scraperhelper"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
)

// acks returns the ack_sequence of every request.
func acks(reqs []*gpumetricsv1.PullRequest) []uint64 {
	out := make([]uint64, len(reqs))
	for i, r := range reqs {
		out[i] = r.GetAckSequence()
	}
	return out
}

// readAfters returns the read_after_sequence of every request.
func readAfters(reqs []*gpumetricsv1.PullRequest) []uint64 {
	out := make([]uint64, len(reqs))
	for i, r := range reqs {
		out[i] = r.GetReadAfterSequence()
	}
	return out
}

func TestRemotePullUntilNotMore(t *testing.T) {
	tests := []struct {
		name  string
		serve func(*testing.T, *fakesidecar.Server) string
	}{
		{name: "tcp", serve: func(t *testing.T, f *fakesidecar.Server) string { return serveTCP(t, f) }},
		{name: "unix", serve: serveUnix},
		{name: "unix single slash", serve: func(t *testing.T, f *fakesidecar.Server) string {
			return "unix:" + strings.TrimPrefix(serveUnix(t, f), "unix://")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakesidecar.New(fakesidecar.Options{MaxBatchesPerPull: 2})
			appendBatches(fake, 5, 3)
			env := newTestEnv(t)
			s := newScraper(t, env, remoteConfig(tt.serve(t, fake)))
			next := newScriptedConsumer()

			scrapeErr, consumeErr := cycle(s, next)
			require.NoError(t, scrapeErr)
			require.NoError(t, consumeErr)
			assert.Equal(t, []string{"b1", "b2", "b3", "b4", "b5"}, next.batchLabels())

			// three pulls (2+2+1 batches), each reading after the previous answer, none
			// acknowledging yet: the pipeline had not answered
			reqs := fake.Requests()
			require.Len(t, reqs, 3)
			assert.Equal(t, []uint64{0, 0, 0}, acks(reqs))
			assert.Equal(t, []uint64{0, 2, 4}, readAfters(reqs))
			assert.Equal(t, []string{"", "epoch-1", "epoch-1"}, []string{reqs[0].GetAckEpoch(), reqs[1].GetAckEpoch(), reqs[2].GetAckEpoch()})
			for _, r := range reqs {
				assert.Equal(t, "gpumetrics/test", r.GetConsumer())
			}
			assert.Equal(t, 5, fake.Held(), "read, not acknowledged: nothing released")

			// the next scrape acknowledges all five, reads after them and gets nothing new
			scrapeErr, consumeErr = cycle(s, next)
			require.NoError(t, scrapeErr)
			require.NoError(t, consumeErr)
			reqs = fake.Requests()
			require.Len(t, reqs, 4)
			assert.Equal(t, uint64(5), reqs[3].GetAckSequence())
			assert.Equal(t, uint64(5), reqs[3].GetReadAfterSequence())
			assert.Equal(t, "epoch-1", reqs[3].GetAckEpoch())
			assert.Nil(t, reqs[3].GetPreviousOutcome())
			assert.Equal(t, uint64(5), fake.Acked("gpumetrics/test"))
			assert.Zero(t, fake.Held(), "one acknowledgement released the whole backlog")
			assert.Len(t, next.batchLabels(), 5, "nothing was delivered twice")
		})
	}
}

func TestRemoteEmptyScrapeIsNotForwarded(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{})
	s := newScraper(t, newTestEnv(t), remoteConfig(serveTCP(t, fake)))
	clock := useFakeClock(s, time.Now())
	next := newScriptedConsumer()

	// no collection stored during the whole scrape (retries included): UNAVAILABLE, a failed
	// scrape, nothing forwarded
	scrapeErr, consumeErr := cycle(s, next)
	assert.Equal(t, codes.Unavailable, status.Code(errors.Unwrap(scrapeErr)), "scrape error: %v", scrapeErr)
	require.NoError(t, consumeErr)
	assert.Empty(t, next.calls, "a failed scrape: the pipeline is not called")
	failedPulls := len(fake.Requests())
	assert.Equal(t, len(clock.recorded())+1, failedPulls, "retried until the budget was spent")

	fake.Append(fakesidecar.Gauge("b1", 1))
	_, _ = cycle(s, next)
	next.waitCall(t)
	scrapeErr, consumeErr = cycle(s, next) // acknowledges b1; nothing new after it
	require.NoError(t, scrapeErr)
	require.NoError(t, consumeErr)
	assert.Len(t, fake.Requests(), failedPulls+2)
	assert.Empty(t, next.calls, "nothing new: the pipeline is not called")
	assert.Equal(t, []string{"b1"}, next.batchLabels())
}

func TestRemotePullsPerScrapeAreBounded(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{})
	appendBatches(fake, 5, 3)
	cfg := remoteConfig(serveTCP(t, fake))
	cfg.MaxPullsPerScrape = 2
	cfg.MaxDataPointsPerPull = 5 // one batch of 3 points per pull
	cfg.MaxBytesPerPull = 4096
	env := newTestEnv(t)
	s := newScraper(t, env, cfg)
	next := newScriptedConsumer()

	tests := []struct {
		wantLabels     []string
		wantAcks       []uint64
		wantReadAfters []uint64
		wantBacklogLog int
	}{
		{wantLabels: []string{"b1", "b2"}, wantAcks: []uint64{0, 0}, wantReadAfters: []uint64{0, 1}, wantBacklogLog: 1},
		{wantLabels: []string{"b1", "b2", "b3", "b4"}, wantAcks: []uint64{2, 2}, wantReadAfters: []uint64{2, 3}, wantBacklogLog: 2},
		{wantLabels: []string{"b1", "b2", "b3", "b4", "b5"}, wantAcks: []uint64{4}, wantReadAfters: []uint64{4}, wantBacklogLog: 2},
	}
	seen := 0
	for i, tt := range tests {
		scrapeErr, consumeErr := cycle(s, next)
		require.NoError(t, scrapeErr, "scrape %d", i)
		require.NoError(t, consumeErr, "scrape %d", i)
		assert.Equal(t, tt.wantLabels, next.batchLabels(), "scrape %d", i)
		reqs := fake.Requests()[seen:]
		seen += len(reqs)
		assert.Equal(t, tt.wantAcks, acks(reqs), "scrape %d", i)
		assert.Equal(t, tt.wantReadAfters, readAfters(reqs), "scrape %d", i)
		for _, r := range reqs {
			assert.Equal(t, uint32(5), r.GetMaxDataPoints())
			assert.Equal(t, uint64(4096), r.GetMaxBytes())
		}
		assert.Equal(t, tt.wantBacklogLog, env.logs.FilterMessageSnippet("Backlog left for the next scrape").Len(), "scrape %d", i)
	}
}

// TestRemoteBacklogDrainsInOneScrape runs the real scraper controller with its tick an hour
// away: the first scrape reads the whole backlog in several pulls and hands it to the pipeline
// as one pmetric.Metrics; one acknowledgement (sent at shutdown) releases all of it.
func TestRemoteBacklogDrainsInOneScrape(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{})
	appendBatches(fake, 6, 2)
	cfg := remoteConfig(serveTCP(t, fake))
	cfg.CollectionInterval = time.Hour
	cfg.MaxDataPointsPerPull = 4 // two batches per pull
	next := newScriptedConsumer()
	rcv, err := newMetricsReceiver(newTestEnv(t).set, cfg, next)
	require.NoError(t, err)
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
	next.waitCall(t)
	require.NoError(t, rcv.Shutdown(context.Background()))

	next.mu.Lock()
	require.Len(t, next.accepted, 1, "one scrape, one hand-off to the pipeline")
	assert.Equal(t, 12, next.accepted[0].DataPointCount())
	next.mu.Unlock()
	assert.Equal(t, []string{"b1", "b2", "b3", "b4", "b5", "b6"}, next.batchLabels())
	reqs := fake.Requests()
	require.Len(t, reqs, 4)
	assert.Equal(t, []uint64{0, 2, 4, 0}, readAfters(reqs))
	assert.Equal(t, []uint64{0, 0, 0, 6}, acks(reqs))
	assert.True(t, reqs[3].GetAckOnly(), "the acknowledgement is sent at shutdown")
	assert.Zero(t, fake.Held())
}

// TestRemoteRefusedDrainIsReadAgain: the pipeline refuses a backlog read in three pulls, so
// nothing is acknowledged; the next scrape reports the refusal, reads from the acknowledged
// cursor again and gets the same batches re-delivered.
func TestRemoteRefusedDrainIsReadAgain(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{MaxBatchesPerPull: 1})
	appendBatches(fake, 3, 2)
	s := newScraper(t, newTestEnv(t), remoteConfig(serveTCP(t, fake)))
	next := newScriptedConsumer(errors.New("memory limiter: refused"))

	_, consumeErr := cycle(s, next)
	require.ErrorContains(t, consumeErr, "refused")
	assert.Empty(t, next.batchLabels())
	assert.Zero(t, fake.Acked("gpumetrics/test"))
	_, consumeErr = cycle(s, next)
	require.NoError(t, consumeErr)
	assert.Equal(t, []string{"b1", "b2", "b3"}, next.batchLabels(), "re-delivered whole, accepted once")
	_, _ = cycle(s, next)

	reqs := fake.Requests()
	require.Len(t, reqs, 7)
	assert.Equal(t, []uint64{0, 1, 2, 0, 1, 2, 3}, readAfters(reqs))
	assert.Equal(t, []uint64{0, 0, 0, 0, 0, 0, 3}, acks(reqs))
	outcome := reqs[3].GetPreviousOutcome()
	require.NotNil(t, outcome, "the refusal is reported in the next scrape's first pull")
	assert.Equal(t, uint64(3), outcome.GetLastSequence())
	assert.Equal(t, int64(6), outcome.GetRejectedDataPoints())
	assert.Nil(t, reqs[4].GetPreviousOutcome(), "reported once")
	assert.Zero(t, fake.Held())
}

// TestRemoteAckOnlyAfterPipelineAccepted drives the real scraper controller: the pipeline refuses
// the first delivery, so nothing is acknowledged, the refusal is reported, and the sidecar
// re-delivers; the acknowledgement follows the accepted delivery.
func TestRemoteAckOnlyAfterPipelineAccepted(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{MaxBatchesPerPull: 10})
	appendBatches(fake, 2, 2)
	env := newTestEnv(t)
	cfg := remoteConfig(serveTCP(t, fake))
	next := newScriptedConsumer(errors.New("pipeline full"))
	ticks := make(chan time.Time)
	rcv, err := newMetricsReceiver(env.set, cfg, next, scraperhelper.WithTickerChannel(ticks))
	require.NoError(t, err)
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))

	next.waitCall(t) // first scrape: refused
	assert.Empty(t, next.batchLabels())
	ticks <- time.Now()
	next.waitCall(t) // second scrape: re-delivered and accepted
	fake.Append(fakesidecar.Gauge("b3", 1))
	ticks <- time.Now()
	next.waitCall(t) // third scrape: acknowledges b1, b2 and gets b3
	require.NoError(t, rcv.Shutdown(context.Background()))

	assert.Equal(t, []string{"b1", "b2", "b3"}, next.batchLabels(), "accepted exactly once")
	reqs := fake.Requests()
	require.Len(t, reqs, 4)
	assert.Equal(t, []uint64{0, 0, 2, 3}, acks(reqs))
	assert.Equal(t, []uint64{0, 0, 2, 0}, readAfters(reqs), "the refused batches are read again from the cursor")
	assert.True(t, reqs[3].GetAckOnly(), "b3's acknowledgement is sent at shutdown")
	outcome := reqs[1].GetPreviousOutcome()
	require.NotNil(t, outcome)
	assert.Equal(t, uint64(2), outcome.GetLastSequence())
	assert.Equal(t, int64(4), outcome.GetRejectedDataPoints())
	assert.Equal(t, "pipeline full", outcome.GetErrorMessage())
	assert.Nil(t, reqs[2].GetPreviousOutcome())
	assert.Equal(t, 1, env.logs.FilterMessageSnippet("not acknowledged, the sidecar will re-deliver").Len())
}

func TestRemotePermanentRejectionIsAcknowledged(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{})
	appendBatches(fake, 1, 3)
	s := newScraper(t, newTestEnv(t), remoteConfig(serveTCP(t, fake)))
	next := newScriptedConsumer(consumererror.NewPermanent(errors.New("bad data")))

	_, consumeErr := cycle(s, next)
	require.Error(t, consumeErr)
	_, consumeErr = cycle(s, next)
	require.NoError(t, consumeErr)

	assert.Empty(t, next.batchLabels(), "a permanently rejected batch is not re-delivered")
	reqs := fake.Requests()
	require.Len(t, reqs, 2)
	assert.Equal(t, uint64(1), reqs[1].GetAckSequence())
	assert.Equal(t, int64(3), reqs[1].GetPreviousOutcome().GetRejectedDataPoints())
	assert.Contains(t, reqs[1].GetPreviousOutcome().GetErrorMessage(), "bad data")
}

func TestRemoteEpochChangeResetsCursor(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{Epoch: "epoch-1"})
	appendBatches(fake, 1, 1)
	env := newTestEnv(t)
	s := newScraper(t, env, remoteConfig(serveTCP(t, fake)))
	next := newScriptedConsumer()
	_, _ = cycle(s, next)

	fake.Restart("epoch-2")
	fake.Append(fakesidecar.Gauge("after-restart", 1))
	scrapeErr, _ := cycle(s, next)
	require.NoError(t, scrapeErr)
	_, _ = cycle(s, next)

	assert.Equal(t, []string{"b1", "after-restart"}, next.batchLabels())
	reqs := fake.Requests()
	require.Len(t, reqs, 3)
	assert.Equal(t, "epoch-1", reqs[1].GetAckEpoch(), "the first pull after the restart still acknowledges the old epoch")
	assert.Equal(t, uint64(1), reqs[1].GetAckSequence())
	assert.Equal(t, uint64(1), reqs[1].GetReadAfterSequence(), "ignored by the restarted sidecar: it answered from sequence 1")
	assert.Equal(t, "epoch-2", reqs[2].GetAckEpoch())
	assert.Equal(t, uint64(1), reqs[2].GetAckSequence())
	assert.Equal(t, uint64(1), reqs[2].GetReadAfterSequence())
	restarts := env.logs.FilterMessageSnippet("sidecar restarted")
	require.Equal(t, 1, restarts.Len())
	assert.Equal(t, "epoch-1", restarts.All()[0].ContextMap()["old_epoch"])
	assert.Equal(t, int64(1), env.counter(t, "otelcol_gpumetrics_sidecar_restarts"))
}

func TestRemoteReportsDrops(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{})
	appendBatches(fake, 1, 1)
	fake.Drop(7, "max_bytes")
	env := newTestEnv(t)
	s := newScraper(t, env, remoteConfig(serveTCP(t, fake)))
	_, _ = cycle(s, newScriptedConsumer())
	_, _ = cycle(s, newScriptedConsumer()) // announces nothing more

	drops := env.logs.FilterMessageSnippet("dropped data points").FilterLevelExact(zapcore.WarnLevel)
	require.Equal(t, 1, drops.Len())
	assert.Equal(t, uint64(7), drops.All()[0].ContextMap()["dropped_data_points"])
	assert.Equal(t, []any{"max_bytes"}, drops.All()[0].ContextMap()["reasons"])
	assert.Equal(t, int64(7), env.counter(t, "otelcol_gpumetrics_sidecar_dropped_data_points"))
}

// TestRemoteRestartBetweenTwoPulls: the sidecar restarts between two pulls of one scrape. Both
// epochs' data reach the pipeline; only the new epoch's is acknowledged, and the stale read
// position is ignored by the new store.
func TestRemoteRestartBetweenTwoPulls(t *testing.T) {
	var (
		fake  *fakesidecar.Server
		pulls atomic.Int32
	)
	fake = fakesidecar.New(fakesidecar.Options{Epoch: "epoch-1", MaxBatchesPerPull: 1, OnPull: func(context.Context) {
		if pulls.Add(1) == 2 {
			fake.Restart("epoch-2")
			fake.Append(fakesidecar.Gauge("after-restart", 1))
		}
	}})
	appendBatches(fake, 2, 1)
	env := newTestEnv(t)
	s := newScraper(t, env, remoteConfig(serveTCP(t, fake)))
	next := newScriptedConsumer()

	scrapeErr, consumeErr := cycle(s, next)
	require.NoError(t, scrapeErr)
	require.NoError(t, consumeErr)
	_, _ = cycle(s, next)

	assert.Equal(t, []string{"b1", "after-restart"}, next.batchLabels())
	reqs := fake.Requests()
	require.Len(t, reqs, 3)
	assert.Equal(t, "epoch-1", reqs[1].GetAckEpoch())
	assert.Equal(t, uint64(1), reqs[1].GetReadAfterSequence(), "stale: ignored by the new store")
	assert.Equal(t, "epoch-2", reqs[2].GetAckEpoch())
	assert.Equal(t, uint64(1), reqs[2].GetAckSequence(), "the new epoch's batch is acknowledged")
	assert.Equal(t, uint64(1), fake.Acked("gpumetrics/test"))
	assert.Equal(t, 1, env.logs.FilterMessageSnippet("sidecar restarted").Len())
}

// TestRemotePullFailsMidScrape: a Pull fails for good (a code that is not retried) after an
// earlier one of the same scrape succeeded.
func TestRemotePullFailsMidScrape(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{MaxBatchesPerPull: 1})
	appendBatches(fake, 2, 1)
	fake.FailRequest(2, status.Error(codes.Internal, "store busy"))
	s := newScraper(t, newTestEnv(t), remoteConfig(serveTCP(t, fake)))
	next := newScriptedConsumer()

	scrapeErr, consumeErr := cycle(s, next)
	require.ErrorContains(t, scrapeErr, "store busy")
	assert.True(t, scrapererror.IsPartialScrapeError(scrapeErr), "the first pull's data still reaches the pipeline")
	require.NoError(t, consumeErr)
	assert.Equal(t, []string{"b1"}, next.batchLabels())

	scrapeErr, _ = cycle(s, next)
	require.NoError(t, scrapeErr)
	assert.Equal(t, []string{"b1", "b2"}, next.batchLabels())
	reqs := fake.Requests()
	require.Len(t, reqs, 3)
	assert.Equal(t, []uint64{0, 1, 1}, readAfters(reqs))
	assert.Equal(t, []uint64{0, 0, 1}, acks(reqs), "b1 was accepted: acknowledged, read after")
}

func TestRemoteSidecarDownThenUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pull.sock")
	fake := fakesidecar.New(fakesidecar.Options{})
	appendBatches(fake, 1, 1)
	s := newScraper(t, newTestEnv(t), remoteConfig("unix://"+path))

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	md, err := s.scrape(ctx)
	require.ErrorContains(t, err, "pull from the gpumetrics sidecar")
	assert.False(t, scrapererror.IsPartialScrapeError(err))
	assert.Equal(t, 0, md.DataPointCount())
	assert.Nil(t, s.cursor.takePending(), "nothing pulled, nothing to acknowledge")

	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	serve(t, lis, fake)
	next := newScriptedConsumer()
	scrapeErr, _ := cycle(s, next)
	require.NoError(t, scrapeErr)
	assert.Equal(t, []string{"b1"}, next.batchLabels())
}

func TestRemoteLargeResponse(t *testing.T) {
	big := fakesidecar.Gauge("big", 1)
	big.ResourceMetrics().At(0).Resource().Attributes().PutStr("padding", strings.Repeat("x", 6<<20))
	tests := []struct {
		name    string
		mib     int
		wantErr bool
	}{
		{name: "default 64 MiB", mib: defaultMaxRecvMsgSizeMiB},
		{name: "4 MiB", mib: 4, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakesidecar.New(fakesidecar.Options{})
			fake.Append(big)
			cfg := remoteConfig(serveTCP(t, fake))
			cfg.MaxRecvMsgSizeMiB = tt.mib
			s := newScraper(t, newTestEnv(t), cfg)
			md, err := s.scrape(context.Background())
			if tt.wantErr {
				assert.Equal(t, codes.ResourceExhausted, status.Code(errors.Unwrap(err)), "error: %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, 1, md.DataPointCount())
		})
	}
}

func TestRemoteShutdownSendsPendingAck(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{MaxBatchesPerPull: 2})
	appendBatches(fake, 2, 1)
	cfg := remoteConfig(serveTCP(t, fake))
	s, err := newPullScraper(newTestEnv(t).set, cfg)
	require.NoError(t, err)
	require.NoError(t, s.start(context.Background(), componenttest.NewNopHost()))
	_, _ = cycle(s, newScriptedConsumer())
	require.NoError(t, s.shutdown(context.Background()))

	reqs := fake.Requests()
	require.Len(t, reqs, 2)
	assert.True(t, reqs[1].GetAckOnly())
	assert.Equal(t, uint64(2), reqs[1].GetAckSequence())
	assert.Equal(t, uint64(2), fake.Acked("gpumetrics/test"))
}
