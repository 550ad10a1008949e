package gpumetricsreceiver

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configopaque"
	"go.opentelemetry.io/collector/config/configretry"
	"go.opentelemetry.io/collector/scraper/scrapererror"
	"go.opentelemetry.io/collector/scraper/scraperhelper"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
)

// notStoredYet is the sidecar's answer before its first collection is stored (docs/protocol.md).
var notStoredYet = status.Error(codes.Unavailable, "no collection has been stored yet; retry later")

// fakeClock is an explicit clock for the retry backoff: a wait advances it at once by the wait
// asked for and records it; it never sleeps.
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	waits []time.Duration
}

// useFakeClock runs s's retries on a fake clock that starts at start, without jitter
// (`retry_on_failure::randomization_factor: 0`).
func useFakeClock(s *pullScraper, start time.Time) *fakeClock {
	c := &fakeClock{t: start}
	s.retry.now = c.now
	s.retry.wait = c.wait
	s.retry.cfg.RandomizationFactor = 0
	return c
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	c.waits = append(c.waits, d)
	return nil
}

func (c *fakeClock) recorded() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, n := range v {
		out[i] = time.Duration(n) * time.Millisecond
	}
	return out
}

// failPulls makes Pulls first..last of fake fail with err.
func failPulls(fake *fakesidecar.Server, first, last int, err error) {
	for n := first; n <= last; n++ {
		fake.FailRequest(n, err)
	}
}

func TestRemoteRetriesUnavailable(t *testing.T) {
	tests := []struct {
		name string
		// newFake builds the sidecar.
		newFake func() *fakesidecar.Server
		// token is the receiver's bearer token.
		token string
		// retry changes the receiver's `retry_on_failure` (nil: the defaults).
		retry func(*configretry.BackOffConfig)
		// deadline of the scrape's context from its start; 0 = no deadline (cfg.Timeout applies).
		deadline time.Duration
		timeout  time.Duration

		wantWaits    []time.Duration
		wantRequests int
		wantLabels   []string
		wantCode     codes.Code // of the scrape error; codes.OK = no error
		wantPartial  bool
		wantErr      string
	}{
		{
			name: "starting: no collection stored for three pulls",
			newFake: func() *fakesidecar.Server {
				var pulls atomic.Int32
				var fake *fakesidecar.Server
				fake = fakesidecar.New(fakesidecar.Options{OnPull: func(context.Context) {
					if pulls.Add(1) == 4 { // the first collection lands before the fourth Pull
						fake.Append(fakesidecar.Gauge("b1", 2))
					}
				}})
				return fake
			},
			deadline:     10 * time.Second,
			wantWaits:    ms(100, 200, 400),
			wantRequests: 4,
			wantLabels:   []string{"b1"},
		},
		{
			name: "backoff doubles up to 1 s",
			newFake: func() *fakesidecar.Server {
				fake := fakesidecar.New(fakesidecar.Options{})
				appendBatches(fake, 1, 1)
				failPulls(fake, 1, 7, notStoredYet)
				return fake
			},
			deadline:     10 * time.Second,
			wantWaits:    ms(100, 200, 400, 800, 1000, 1000, 1000),
			wantRequests: 8,
			wantLabels:   []string{"b1"},
		},
		{
			name: "unavailable between two pulls of one scrape",
			newFake: func() *fakesidecar.Server {
				fake := fakesidecar.New(fakesidecar.Options{MaxBatchesPerPull: 1})
				appendBatches(fake, 2, 1)
				failPulls(fake, 2, 3, status.Error(codes.Unavailable, "connection reset"))
				return fake
			},
			deadline:     10 * time.Second,
			wantWaits:    ms(100, 200),
			wantRequests: 4,
			wantLabels:   []string{"b1", "b2"},
		},
		{
			// 0.1+0.2+0.4+0.8+6×1 = 7.5 s, then the last wait is cut to the 0.5 s left of 8 s
			name:         "never stored: retries end at 4/5 of the scrape deadline",
			newFake:      func() *fakesidecar.Server { return fakesidecar.New(fakesidecar.Options{}) },
			deadline:     10 * time.Second,
			wantWaits:    ms(100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000, 1000, 500),
			wantRequests: 12,
			wantCode:     codes.Unavailable,
			wantErr:      "pull from the gpumetrics sidecar (retries: 11 in 8s): rpc error: code = Unavailable desc = no collection has been stored yet; retry later",
		},
		{
			name:         "no deadline on the context: `timeout` from the scrape's start",
			newFake:      func() *fakesidecar.Server { return fakesidecar.New(fakesidecar.Options{}) },
			timeout:      2 * time.Second,
			wantWaits:    ms(100, 200, 400, 800, 100),
			wantRequests: 6,
			wantCode:     codes.Unavailable,
			wantErr:      "(retries: 5 in 1.6s)",
		},
		{
			name: "unavailable after data until the budget is spent: partial scrape",
			newFake: func() *fakesidecar.Server {
				fake := fakesidecar.New(fakesidecar.Options{MaxBatchesPerPull: 1})
				appendBatches(fake, 2, 1)
				failPulls(fake, 2, 100, notStoredYet)
				return fake
			},
			deadline:     10 * time.Second,
			wantWaits:    ms(100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000, 1000, 500),
			wantRequests: 13,
			wantLabels:   []string{"b1"},
			wantCode:     codes.Unavailable,
			wantPartial:  true,
		},
		{
			name:    "retry_on_failure tuned: 50 ms tripling up to 400 ms, at most 1 s",
			newFake: func() *fakesidecar.Server { return fakesidecar.New(fakesidecar.Options{}) },
			retry: func(r *configretry.BackOffConfig) {
				r.InitialInterval, r.Multiplier, r.MaxInterval, r.MaxElapsedTime = 50*time.Millisecond, 3, 400*time.Millisecond, time.Second
			},
			deadline:     10 * time.Second,
			wantWaits:    ms(50, 150, 400, 400),
			wantRequests: 5,
			wantCode:     codes.Unavailable,
			wantErr:      "(retries: 4 in 1s)",
		},
		{
			name: "retry_on_failure disabled: the first UNAVAILABLE fails the scrape",
			newFake: func() *fakesidecar.Server {
				fake := fakesidecar.New(fakesidecar.Options{})
				appendBatches(fake, 1, 1)
				fake.FailRequest(1, notStoredYet)
				return fake
			},
			retry:        func(r *configretry.BackOffConfig) { r.Enabled = false },
			deadline:     10 * time.Second,
			wantRequests: 1,
			wantCode:     codes.Unavailable,
			wantErr:      "pull from the gpumetrics sidecar: rpc error: code = Unavailable",
		},
		{
			name: "internal: not retried",
			newFake: func() *fakesidecar.Server {
				fake := fakesidecar.New(fakesidecar.Options{})
				appendBatches(fake, 1, 1)
				fake.FailRequest(1, status.Error(codes.Internal, "store broken"))
				return fake
			},
			deadline:     10 * time.Second,
			wantRequests: 1,
			wantCode:     codes.Internal,
			wantErr:      "pull from the gpumetrics sidecar: rpc error: code = Internal desc = store broken",
		},
		{
			name: "failed precondition: not retried",
			newFake: func() *fakesidecar.Server {
				fake := fakesidecar.New(fakesidecar.Options{})
				appendBatches(fake, 1, 1)
				fake.FailRequest(1, status.Error(codes.FailedPrecondition, "produce failed"))
				return fake
			},
			deadline:     10 * time.Second,
			wantRequests: 1,
			wantCode:     codes.FailedPrecondition,
		},
		{
			name: "wrong token: not retried",
			newFake: func() *fakesidecar.Server {
				fake := fakesidecar.New(fakesidecar.Options{Token: "s3cret"})
				appendBatches(fake, 1, 1)
				return fake
			},
			token:        "wrong",
			deadline:     10 * time.Second,
			wantRequests: 0, // refused before the fake records it
			wantCode:     codes.Unauthenticated,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := tt.newFake()
			env := newTestEnv(t)
			cfg := remoteConfig(serveTCP(t, fake))
			cfg.Token = configopaque.String(tt.token)
			if tt.timeout > 0 {
				cfg.Timeout = tt.timeout
			}
			if tt.retry != nil {
				tt.retry(&cfg.RetryOnFailure)
			}
			s := newScraper(t, env, cfg)
			start := time.Now()
			clock := useFakeClock(s, start)
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, start.Add(tt.deadline))
				defer cancel()
			}
			next := newScriptedConsumer()

			scrapeErr, consumeErr := cycleCtx(ctx, s, next)
			require.NoError(t, consumeErr)
			assert.Equal(t, tt.wantWaits, clock.recorded(), "backoff waits")
			assert.Len(t, fake.Requests(), tt.wantRequests)
			assert.Equal(t, tt.wantLabels, next.batchLabels())
			if tt.wantCode == codes.OK {
				require.NoError(t, scrapeErr)
			} else {
				require.Error(t, scrapeErr)
				assert.Equal(t, tt.wantPartial, scrapererror.IsPartialScrapeError(scrapeErr), "scrape error: %v", scrapeErr)
				if tt.wantPartial { // PartialScrapeError does not unwrap: read the code from the message
					assert.Contains(t, scrapeErr.Error(), "code = "+tt.wantCode.String())
				} else {
					assert.Equal(t, tt.wantCode, status.Code(scrapeErr), "scrape error: %v", scrapeErr)
				}
				if tt.wantErr != "" {
					assert.Contains(t, scrapeErr.Error(), tt.wantErr)
				}
			}

			// the retry is logged once per scrape, at DEBUG; nothing above DEBUG at all
			retrying := env.logs.FilterMessageSnippet("retrying the Pull within this scrape")
			if len(tt.wantWaits) == 0 {
				assert.Zero(t, retrying.Len())
			} else {
				require.Equal(t, 1, retrying.Len())
				assert.Equal(t, zapcore.DebugLevel, retrying.All()[0].Level)
			}
			answered := env.logs.FilterMessageSnippet("answered after retries")
			if tt.wantCode == codes.OK && len(tt.wantWaits) > 0 {
				require.Equal(t, 1, answered.Len())
				assert.Equal(t, int64(len(tt.wantWaits)), answered.All()[0].ContextMap()["retries"])
			} else {
				assert.Zero(t, answered.Len())
			}
			for _, e := range env.logs.All() {
				assert.Equal(t, zapcore.DebugLevel, e.Level, "unexpected log: %s", e.Message)
			}
		})
	}
}

// TestRemoteStartingSidecarCostsNoFailedScrape runs the real scraper controller against a sidecar
// whose first collection lands while the first scrape is retrying: the scrape delivers it and
// the controller logs no "Error scraping metrics".
func TestRemoteStartingSidecarCostsNoFailedScrape(t *testing.T) {
	var (
		fake  *fakesidecar.Server
		pulls atomic.Int32
	)
	fake = fakesidecar.New(fakesidecar.Options{OnPull: func(context.Context) {
		if pulls.Add(1) == 3 {
			fake.Append(fakesidecar.Gauge("b1", 1))
		}
	}})
	env := newTestEnv(t)
	next := newScriptedConsumer()
	rcv, err := newMetricsReceiver(env.set, remoteConfig(serveTCP(t, fake)), next, scraperhelper.WithTickerChannel(make(chan time.Time)))
	require.NoError(t, err)
	clock := useFakeClock(rcv.(*metricsReceiver).scraper, time.Now())
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
	next.waitCall(t)
	require.NoError(t, rcv.Shutdown(context.Background()))

	assert.Equal(t, []string{"b1"}, next.batchLabels())
	assert.Equal(t, ms(100, 200), clock.recorded())
	assert.Zero(t, env.logs.FilterMessage("Error scraping metrics").Len())
	assert.Zero(t, env.logs.FilterLevelExact(zapcore.ErrorLevel).Len()+env.logs.FilterLevelExact(zapcore.WarnLevel).Len())
}

// TestRemoteShutdownDuringBackoff: the receiver shuts down while a scrape waits to retry (a
// timeout of an hour, so only the shutdown can end the wait, which is the real timer wait): the
// wait ends, the scrape returns its last Pull error and Shutdown returns.
func TestRemoteShutdownDuringBackoff(t *testing.T) {
	fake := fakesidecar.New(fakesidecar.Options{}) // never stores a collection
	env := newTestEnv(t)
	cfg := remoteConfig(serveTCP(t, fake))
	cfg.Timeout = time.Hour
	next := newScriptedConsumer()
	rcv, err := newMetricsReceiver(env.set, cfg, next, scraperhelper.WithTickerChannel(make(chan time.Time)))
	require.NoError(t, err)
	waiting := make(chan time.Duration, 1)
	rcv.(*metricsReceiver).scraper.retry.wait = func(ctx context.Context, d time.Duration) error {
		waiting <- d
		return sleepContext(ctx, time.Hour)
	}
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
	select {
	case d := <-waiting:
		assert.InDelta(t, float64(defaultRetryInitialInterval), float64(d), float64(defaultRetryInitialInterval)*defaultRetryRandomizationFactor+1)
	case <-time.After(30 * time.Second):
		t.Fatal("the scrape did not start a backoff wait within 30 s")
	}

	done := make(chan error, 1)
	go func() { done <- rcv.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown did not end the backoff wait within 30 s")
	}

	assert.Len(t, fake.Requests(), 1, "no Pull after the interrupted wait")
	failed := env.logs.FilterMessage("Error scraping metrics")
	require.Equal(t, 1, failed.Len())
	assert.Contains(t, failed.All()[0].ContextMap()["error"], "(retries: 1 in ")
	assert.Contains(t, failed.All()[0].ContextMap()["error"], "code = Unavailable")
}

// TestDefaultRetryWaitsAreJittered: the default `retry_on_failure` spreads each wait over ±20 %
// of 100 ms, 200 ms, ... 1 s (cenkalti/backoff's randomization), so receivers that lost the same
// sidecar do not retry in lock step.
func TestDefaultRetryWaitsAreJittered(t *testing.T) {
	r := newPullRetry(defaultRetryConfig())
	nominal := ms(100, 200, 400, 800, 1000, 1000)
	seen := map[time.Duration]bool{}
	for range 200 {
		waits := r.backoff()
		for _, d := range nominal {
			got := waits.NextBackOff()
			require.GreaterOrEqual(t, got, time.Duration(float64(d)*0.8), "a wait of %s", d)
			require.LessOrEqual(t, got, time.Duration(float64(d)*1.2)+1, "a wait of %s", d)
			if d == nominal[0] {
				seen[got] = true
			}
		}
	}
	assert.Greater(t, len(seen), 1, "the waits vary")
}

func TestSleepContext(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want error
	}{
		{name: "elapsed", ctx: context.Background(), d: 0, want: nil},
		{name: "context ended first", ctx: cancelled, d: time.Hour, want: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, sleepContext(tt.ctx, tt.d))
		})
	}
}
