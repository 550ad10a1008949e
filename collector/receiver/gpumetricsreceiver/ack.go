package gpumetricsreceiver

import (
	"context"
	"sync"

	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.uber.org/zap"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// delivery is what one scrape handed to the pipeline: the batches up to lastSequence of epoch.
type delivery struct {
	epoch        string
	lastSequence uint64
	// points is the number of data points handed to the pipeline.
	points int64
	// rejected counts data points the receiver itself could not decode (already reported as a
	// partial scrape error); rejectReason says why.
	rejected     int64
	rejectReason string
}

// cursor is the receiver's side of the pull protocol (proto/gpumetrics/v1/pull.proto): what the
// pipeline accepted (sent as ack_sequence/ack_epoch, and where each scrape starts reading), what
// is still in flight in the pipeline, and the outcome to report in the next
// PullRequest.previous_outcome. Safe for concurrent use.
type cursor struct {
	mu      sync.Mutex
	epoch   string // the sidecar's store epoch that acked belongs to ("" before the first pull)
	acked   uint64 // highest sequence the pipeline accepted in epoch
	unsent  bool   // acked advanced since a request last carried it
	outcome *gpumetricsv1.PreviousOutcome
	pending *delivery
}

// request builds the next PullRequest with the current acknowledgement and outcome, reading
// after readAfter (a sequence of the cursor's epoch; the sidecar ignores it for another epoch).
func (c *cursor) request(consumer string, readAfter uint64, maxPoints uint32, maxBytes uint64, ackOnly bool) *gpumetricsv1.PullRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &gpumetricsv1.PullRequest{
		Consumer:          consumer,
		AckSequence:       c.acked,
		AckEpoch:          c.epoch,
		ReadAfterSequence: readAfter,
		MaxDataPoints:     maxPoints,
		MaxBytes:          maxBytes,
		PreviousOutcome:   c.outcome,
		AckOnly:           ackOnly,
	}
}

// readStart returns where a scrape starts reading: right after what the pipeline accepted. Equal
// to 0 for a sidecar that knows this consumer; it also skips what was accepted when the sidecar
// forgot the consumer and re-registered it from its oldest batch.
func (c *cursor) readStart() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked
}

// delivered records that req reached the sidecar: its acknowledgement and outcome need not be
// sent again.
func (c *cursor) delivered(req *gpumetricsv1.PullRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if req.GetAckEpoch() == c.epoch && req.GetAckSequence() == c.acked {
		c.unsent = false
	}
	if c.outcome == req.GetPreviousOutcome() {
		c.outcome = nil
	}
}

// observeEpoch adopts the epoch of a response. It returns the previous epoch and true when the
// sidecar restarted (a different, non-first epoch): the acknowledgement cursor is then reset,
// since sequences began again, and whatever is in flight belongs to the old store.
func (c *cursor) observeEpoch(epoch string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch == c.epoch {
		return epoch, false
	}
	old := c.epoch
	c.epoch, c.acked, c.unsent, c.outcome = epoch, 0, false, nil
	return old, old != ""
}

// hasUnsentAck reports whether an acknowledgement is waiting for the next request.
func (c *cursor) hasUnsentAck() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unsent
}

func (c *cursor) setPending(d *delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = d
}

func (c *cursor) takePending() *delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.pending
	c.pending = nil
	return d
}

// settle applies the pipeline's verdict on d. Accepted (err == nil) or permanently rejected
// data is acknowledged (a permanent error will not go away by re-delivering); any other error
// leaves the acknowledgement where it was, so the next scrape reads from it again and the
// sidecar re-delivers. Every rejection is
// reported in the next request's previous_outcome. It returns true when d was acknowledged.
func (c *cursor) settle(d *delivery, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.epoch != c.epoch {
		return false // the sidecar restarted while d was in the pipeline: nothing to acknowledge
	}
	ack := err == nil || consumererror.IsPermanent(err)
	if ack && d.lastSequence > c.acked {
		c.acked, c.unsent = d.lastSequence, true
	}
	switch {
	case err != nil:
		c.outcome = &gpumetricsv1.PreviousOutcome{
			LastSequence:       d.lastSequence,
			RejectedDataPoints: d.points + d.rejected,
			ErrorMessage:       err.Error(),
		}
	case d.rejected > 0:
		c.outcome = &gpumetricsv1.PreviousOutcome{
			LastSequence:       d.lastSequence,
			RejectedDataPoints: d.rejected,
			ErrorMessage:       d.rejectReason,
		}
	default:
		c.outcome = nil
	}
	return ack
}

// ackingConsumer sits between the scraper controller and the pipeline: it forwards each scrape's
// data to next and settles the scrape's delivery with next's verdict.
type ackingConsumer struct {
	next    consumer.Metrics
	scraper *pullScraper
}

var _ consumer.Metrics = (*ackingConsumer)(nil)

// Capabilities are next's.
func (a *ackingConsumer) Capabilities() consumer.Capabilities { return a.next.Capabilities() }

// ConsumeMetrics hands md to next, then acknowledges (or not) what the scrape pulled. An empty
// md (nothing new, or a failed scrape) is not forwarded: the controller calls the consumer after
// every scrape, and an exporter would write an empty record for it (the file exporter: "{}").
func (a *ackingConsumer) ConsumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	d := a.scraper.cursor.takePending()
	var err error
	if md.ResourceMetrics().Len() > 0 {
		err = a.next.ConsumeMetrics(ctx, md)
	}
	settle(a.scraper.logger, &a.scraper.cursor, d, err, "data_points")
	return err
}

// settle applies the pipeline's verdict err on the scrape's delivery d (nil: nothing pulled)
// and logs it; items names the counted field in the log ("data_points", "log_records").
func settle(logger *zap.Logger, cur *cursor, d *delivery, err error, items string) {
	if d == nil {
		return
	}
	acked := cur.settle(d, err)
	switch {
	case err == nil:
		logger.Debug("Pipeline accepted the pulled batches", zap.String("epoch", d.epoch),
			zap.Uint64("last_sequence", d.lastSequence), zap.Int64(items, d.points))
	case acked:
		logger.Warn("Pipeline permanently rejected the pulled batches; acknowledged so the sidecar does not re-deliver them",
			zap.Uint64("last_sequence", d.lastSequence), zap.Int64(items, d.points), zap.Error(err))
	default:
		logger.Warn("Pipeline refused the pulled batches; not acknowledged, the sidecar will re-deliver them",
			zap.Uint64("last_sequence", d.lastSequence), zap.Int64(items, d.points), zap.Error(err))
	}
}
