package gpumetricsreceiver

import (
	"context"
	"time"
)

// scheduler feeds the scraper controller's ticker channel: one tick per collection interval, and
// an early one as soon as the pipeline accepted a delivery after which the sidecar said more
// batches wait. A sidecar that serves from the acknowledged cursor (the Python store does) can
// hand out the next batches only once the previous ones are acknowledged, so a backlog drains at
// the pipeline's pace instead of one response per interval. At most maxEarly early ticks follow
// each regular one, so a sidecar that always says `more` cannot make the receiver spin.
type scheduler struct {
	interval time.Duration
	maxEarly int
	ticks    chan time.Time
	early    chan struct{}
}

func newScheduler(interval time.Duration, maxEarly int) *scheduler {
	return &scheduler{
		interval: interval,
		maxEarly: maxEarly,
		ticks:    make(chan time.Time),
		early:    make(chan struct{}, 1),
	}
}

// requestEarly asks for the next scrape now; it never blocks.
func (sc *scheduler) requestEarly() {
	select {
	case sc.early <- struct{}{}:
	default:
	}
}

// run feeds ticks until stopped ends.
func (sc *scheduler) run(stopped context.Context) {
	t := time.NewTicker(sc.interval)
	defer t.Stop()
	early := 0
	for {
		var now time.Time
		select {
		case <-stopped.Done():
			return
		case now = <-t.C:
			early = 0
		case <-sc.early:
			if early >= sc.maxEarly {
				continue
			}
			early++
			now = time.Now()
		}
		select {
		case sc.ticks <- now:
		case <-stopped.Done():
			return
		}
	}
}
