package gpumetricsreceiver

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v7"
	"go.opentelemetry.io/collector/config/configretry"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

// A sidecar that has just started or restarted accepts connections before its first collection
// is stored and answers Pull with UNAVAILABLE ("no collection has been stored yet; retry later",
// docs/protocol.md); a connection broken by a restart is UNAVAILABLE as well. Such a Pull is
// retried within the scrape, so a short start or restart costs no failed scrape. The backoff is
// the Collector's: `retry_on_failure` is a configretry.BackOffConfig, tuned like the exporters'
// (exporterhelper), and the waits come from the same library (cenkalti/backoff's exponential
// backoff); all retries of a scrape share one end, within its deadline, and a receiver shutdown
// interrupts a wait (docs/collector.md).

// Defaults of `retry_on_failure`: a sidecar that starts or restarts is usually serving within a
// second or two, well inside the default 10 s scrape `timeout`.
const (
	defaultRetryInitialInterval     = 100 * time.Millisecond
	defaultRetryMaxInterval         = time.Second
	defaultRetryMultiplier          = 2
	defaultRetryRandomizationFactor = 0.2
)

// Retries stop once retryBudgetNum/retryBudgetDen of the time from the scrape's start to its
// deadline is spent (or at `max_elapsed_time`, when earlier). The rest is kept for the last Pull
// and for the hand-off to the pipeline, which runs under the same deadline (scraperhelper's
// `timeout`).
const (
	retryBudgetNum = 4
	retryBudgetDen = 5
)

// defaultRetryConfig returns the receiver's `retry_on_failure` defaults: enabled, 100 ms doubling
// to 1 s, ±20 % jitter, no `max_elapsed_time` of its own (the scrape deadline bounds it).
func defaultRetryConfig() configretry.BackOffConfig {
	return configretry.BackOffConfig{
		Enabled:             true,
		InitialInterval:     defaultRetryInitialInterval,
		MaxInterval:         defaultRetryMaxInterval,
		Multiplier:          defaultRetryMultiplier,
		RandomizationFactor: defaultRetryRandomizationFactor,
	}
}

// pullRetry is how a scrape retries a Pull the sidecar answered with UNAVAILABLE: the
// configured backoff, and the clock it runs on. now and wait are fields so that tests run the
// backoff on an explicit clock instead of sleeping.
type pullRetry struct {
	cfg configretry.BackOffConfig
	// now reads the clock the retry budget is measured on.
	now func() time.Time
	// wait blocks for d or until ctx ends, whichever is first, and returns ctx's error in the
	// second case.
	wait func(ctx context.Context, d time.Duration) error
}

// newPullRetry returns the policy of cfg on the wall clock, with a timer.
func newPullRetry(cfg configretry.BackOffConfig) pullRetry {
	return pullRetry{cfg: cfg, now: time.Now, wait: sleepContext}
}

// sleepContext waits for d, or returns ctx.Err() as soon as ctx ends (receiver shutdown or the
// scrape's deadline).
func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryBudget is one scrape's account of its retries: they share a single end time, and are
// counted for the logs and the error message.
type retryBudget struct {
	start, stopAt time.Time
	retries       int
}

// newBudget starts the retry budget of a scrape whose context is ctx: retries end at 4/5 of
// the way to ctx's deadline or, when ctx has none (the controller always sets one, since
// `timeout` must be > 0), to timeout from now; and at `max_elapsed_time` when that is earlier.
func (r *pullRetry) newBudget(ctx context.Context, timeout time.Duration) *retryBudget {
	start := r.now()
	end, ok := ctx.Deadline()
	if !ok {
		end = start.Add(timeout)
	}
	stopAt := start.Add(end.Sub(start) * retryBudgetNum / retryBudgetDen)
	if r.cfg.MaxElapsedTime > 0 {
		stopAt = minTime(stopAt, start.Add(r.cfg.MaxElapsedTime))
	}
	return &retryBudget{start: start, stopAt: stopAt}
}

// backoff returns the waits of one Pull's retries: `initial_interval`, times `multiplier` after
// each, up to `max_interval`, each spread by ±`randomization_factor` (exporterhelper's use of the
// same library).
func (r *pullRetry) backoff() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     r.cfg.InitialInterval,
		RandomizationFactor: r.cfg.RandomizationFactor,
		Multiplier:          r.cfg.Multiplier,
		MaxInterval:         r.cfg.MaxInterval,
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// next returns the wait before the next retry of a Pull (from its backoff waits), cut to what
// is left of the budget; ok is false when retrying is disabled or nothing is left.
func (r *pullRetry) next(b *retryBudget, waits *backoff.ExponentialBackOff) (time.Duration, bool) {
	if !r.cfg.Enabled {
		return 0, false
	}
	left := b.stopAt.Sub(r.now())
	if left <= 0 {
		return 0, false
	}
	return min(waits.NextBackOff(), left), true
}

// wrap adds the retries made (if any) to the error of a Pull that failed for good.
func (b *retryBudget) wrap(err error, now time.Time) error {
	if b.retries == 0 {
		return fmt.Errorf("pull from the gpumetrics sidecar: %w", err)
	}
	return fmt.Errorf("pull from the gpumetrics sidecar (retries: %d in %s): %w",
		b.retries, now.Sub(b.start).Round(time.Millisecond), err)
}

// pullRetrying sends req on conn and, while the answer is UNAVAILABLE, sends it again after a
// backoff wait, until it succeeds, fails otherwise, budget runs out, or the scrape ends (ctx:
// receiver shutdown or the scrape's deadline). The same request is resent: a failed Pull changed
// nothing on the sidecar or in the cursor. After every failure the connection is checked first
// (dropIfLost): a subprocess that exited or stopped answering is dropped, not retried, and the
// next scrape starts a new one. It returns the last Pull's error; the first retry of a scrape is
// logged at DEBUG, as a sidecar that is starting is expected, not a fault.
func (s *pullScraper) pullRetrying(ctx, stopped context.Context, conn sidecar.Conn, req *gpumetricsv1.PullRequest, budget *retryBudget, sig signal) (*pullAnswer, error) {
	waits := s.retry.backoff()
	for {
		resp, err := sig.pull(ctx, conn, req)
		if err == nil {
			return resp, nil
		}
		if s.dropIfLost(stopped, conn) || status.Code(err) != codes.Unavailable {
			return nil, err
		}
		wait, ok := s.retry.next(budget, waits)
		if !ok {
			return nil, err
		}
		if budget.retries == 0 {
			s.logger.Debug("The gpumetrics sidecar is unavailable (starting or restarting?); retrying the Pull within this scrape",
				zap.Error(err), zap.Duration("retry_for", budget.stopAt.Sub(s.retry.now())))
		}
		budget.retries++
		if s.retry.wait(ctx, wait) != nil {
			return nil, err
		}
	}
}
