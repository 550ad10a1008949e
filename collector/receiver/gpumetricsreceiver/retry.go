package gpumetricsreceiver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/sidecar"
)

// A sidecar that has just started or restarted accepts connections before its first collection
// is stored and answers Pull with UNAVAILABLE ("no collection has been stored yet; retry later",
// docs/protocol.md); a connection broken by a restart is UNAVAILABLE as well. Such a Pull is
// retried within the scrape, with the backoff below, so a short start or restart costs no
// failed scrape. The shape follows the OTLP exporters' retry (one deadline for all attempts,
// jittered exponential backoff, a wait that shutdown interrupts; docs/collector.md).
const (
	// retryInitialDelay is the wait before the first retry of a Pull; each further wait
	// doubles, up to retryMaxDelay.
	retryInitialDelay = 100 * time.Millisecond
	retryMaxDelay     = time.Second
	// retryJitter spreads each wait uniformly over ±20 % of its nominal value.
	retryJitter = 0.2
	// Retries stop once retryBudgetNum/retryBudgetDen of the time from the scrape's start to its
	// deadline is spent. The rest is kept for the last Pull and for the hand-off to the
	// pipeline, which runs under the same deadline (scraperhelper's `timeout`).
	retryBudgetNum = 4
	retryBudgetDen = 5
)

// pullRetry is how a scrape retries a Pull the sidecar answered with UNAVAILABLE. Its functions
// are fields so that tests run the backoff on an explicit clock instead of sleeping.
type pullRetry struct {
	// initialDelay is the nominal wait before a Pull's first retry; each further wait doubles,
	// up to maxDelay.
	initialDelay, maxDelay time.Duration
	// now reads the clock the retry budget is measured on.
	now func() time.Time
	// wait blocks for d or until ctx ends, whichever is first, and returns ctx's error in the
	// second case.
	wait func(ctx context.Context, d time.Duration) error
	// jitter returns the wait actually used for a nominal wait d.
	jitter func(d time.Duration) time.Duration
}

// defaultPullRetry returns the production policy: 100 ms doubling to 1 s, ±20 % jitter, the
// wall clock and a timer.
func defaultPullRetry() pullRetry {
	return pullRetry{
		initialDelay: retryInitialDelay,
		maxDelay:     retryMaxDelay,
		now:          time.Now,
		wait:         sleepContext,
		jitter:       jitterDelay,
	}
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

// jitterDelay returns d scaled by a uniform factor in [1-retryJitter, 1+retryJitter), so that
// receivers that lost the same sidecar do not retry in lock step.
func jitterDelay(d time.Duration) time.Duration {
	f := 1 + retryJitter*(2*rand.Float64()-1) //nolint:gosec // jitter needs no cryptographic randomness
	return time.Duration(float64(d) * f)
}

// retryBudget is one scrape's account of its retries: they share a single end time, and are
// counted for the logs and the error message.
type retryBudget struct {
	start, stopAt time.Time
	retries       int
}

// newBudget starts the retry budget of a scrape whose context is ctx: retries end at 4/5 of
// the way to ctx's deadline or, when ctx has none (the controller always sets one, since
// `timeout` must be > 0), to timeout from now.
func (r *pullRetry) newBudget(ctx context.Context, timeout time.Duration) *retryBudget {
	start := r.now()
	end, ok := ctx.Deadline()
	if !ok {
		end = start.Add(timeout)
	}
	return &retryBudget{start: start, stopAt: start.Add(end.Sub(start) * retryBudgetNum / retryBudgetDen)}
}

// next returns the wait before the retry that follows a nominal delay, cut to what is left of
// the budget; ok is false when nothing is left.
func (r *pullRetry) next(b *retryBudget, delay time.Duration) (time.Duration, bool) {
	left := b.stopAt.Sub(r.now())
	if left <= 0 {
		return 0, false
	}
	return min(r.jitter(delay), left), true
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
	delay := s.retry.initialDelay
	for {
		resp, err := sig.pull(ctx, conn, req)
		if err == nil {
			return resp, nil
		}
		if s.dropIfLost(stopped, conn) || status.Code(err) != codes.Unavailable {
			return nil, err
		}
		wait, ok := s.retry.next(budget, delay)
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
		delay = min(2*delay, s.retry.maxDelay)
	}
}
