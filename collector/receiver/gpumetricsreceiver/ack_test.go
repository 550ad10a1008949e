package gpumetricsreceiver

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/collector/consumer/consumererror"
)

func TestCursorSettle(t *testing.T) {
	tests := []struct {
		name         string
		delivery     delivery
		err          error
		wantAcked    uint64
		wantAck      bool
		wantRejected int64 // -1: no outcome
		wantMessage  string
	}{
		{name: "accepted", delivery: delivery{epoch: "e", lastSequence: 5, points: 3}, wantAcked: 5, wantAck: true, wantRejected: -1},
		{
			name: "refused", delivery: delivery{epoch: "e", lastSequence: 5, points: 3}, err: errors.New("full"),
			wantAcked: 2, wantRejected: 3, wantMessage: "full",
		},
		{
			name: "permanent", delivery: delivery{epoch: "e", lastSequence: 5, points: 3}, err: consumererror.NewPermanent(errors.New("bad")),
			wantAcked: 5, wantAck: true, wantRejected: 3, wantMessage: "bad",
		},
		{
			name: "accepted with undecodable batches", delivery: delivery{epoch: "e", lastSequence: 5, points: 3, rejected: 4, rejectReason: "decoding"},
			wantAcked: 5, wantAck: true, wantRejected: 4, wantMessage: "decoding",
		},
		{name: "older epoch", delivery: delivery{epoch: "old", lastSequence: 9, points: 1}, wantAcked: 2, wantRejected: -1},
		{name: "never moves back", delivery: delivery{epoch: "e", lastSequence: 1, points: 1}, wantAcked: 2, wantAck: true, wantRejected: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &cursor{epoch: "e", acked: 2}
			assert.Equal(t, tt.wantAck, c.settle(&tt.delivery, tt.err))
			req := c.request("x", 0, 0, 0, false)
			assert.Equal(t, tt.wantAcked, req.GetAckSequence())
			assert.Equal(t, tt.wantAcked, c.readStart(), "the next scrape reads after what was acknowledged")
			assert.Equal(t, "e", req.GetAckEpoch())
			if tt.wantRejected < 0 {
				assert.Nil(t, req.GetPreviousOutcome())
				return
			}
			assert.Equal(t, tt.delivery.lastSequence, req.GetPreviousOutcome().GetLastSequence())
			assert.Equal(t, tt.wantRejected, req.GetPreviousOutcome().GetRejectedDataPoints())
			assert.Contains(t, req.GetPreviousOutcome().GetErrorMessage(), tt.wantMessage)
		})
	}
}

func TestCursorObserveEpoch(t *testing.T) {
	c := &cursor{}
	old, restarted := c.observeEpoch("e1")
	assert.False(t, restarted, "the first epoch is not a restart")
	assert.Empty(t, old)
	c.settle(&delivery{epoch: "e1", lastSequence: 3}, nil)
	assert.True(t, c.hasUnsentAck())

	old, restarted = c.observeEpoch("e2")
	assert.True(t, restarted)
	assert.Equal(t, "e1", old)
	req := c.request("x", 0, 0, 0, false)
	assert.Equal(t, uint64(0), req.GetAckSequence(), "sequences began again")
	assert.Equal(t, "e2", req.GetAckEpoch())
	assert.False(t, c.hasUnsentAck())
}

func TestCursorDelivered(t *testing.T) {
	c := &cursor{epoch: "e"}
	c.settle(&delivery{epoch: "e", lastSequence: 3, points: 1}, errors.New("no"))
	req := c.request("x", 0, 0, 0, false)
	assert.NotNil(t, req.GetPreviousOutcome())
	c.delivered(req)
	assert.Nil(t, c.request("x", 0, 0, 0, false).GetPreviousOutcome(), "an outcome is reported once")

	c.settle(&delivery{epoch: "e", lastSequence: 3, points: 1}, nil)
	assert.True(t, c.hasUnsentAck())
	c.delivered(c.request("x", 0, 0, 0, false))
	assert.False(t, c.hasUnsentAck())
}
