package gpumetricsreceiver

import (
	"context"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/receiver"
)

// One `gpumetrics` receiver in a metrics and a logs pipeline is two receivers to the Collector
// (one per signal) built from the same *Config. They must share one sidecar: one go-plugin
// subprocess, one connection, one consumer name (each store keeps its own cursor for it). So the
// factory keeps one pullScraper per *Config, as the OTLP receiver keeps one server per config
// (go.opentelemetry.io/collector/receiver/otlpreceiver, its sharedcomponent map), and each
// receiver holds a lease on it: the first Start connects, the last Shutdown sends the pending
// acknowledgements and closes the connection (stopping a subprocess).

// sharedScrapers holds the scraper of every *Config with a receiver that was created and not yet
// shut down.
var sharedScrapers = struct {
	mu sync.Mutex
	m  map[*Config]*sharedScraper
}{m: map[*Config]*sharedScraper{}}

// sharedScraper is a pullScraper and the count of its leases.
type sharedScraper struct {
	s *pullScraper

	mu      sync.Mutex
	leases  int // receivers created on it and not shut down
	started int // of them, started
}

// lease is one receiver's hold on a sharedScraper.
type lease struct {
	shared  *sharedScraper
	cfg     *Config
	mu      sync.Mutex
	started bool
	done    bool
}

// acquireScraper returns a lease on the scraper of cfg, creating the scraper for the first
// receiver of cfg.
func acquireScraper(set receiver.Settings, cfg *Config) (*lease, error) {
	sharedScrapers.mu.Lock()
	defer sharedScrapers.mu.Unlock()
	sh := sharedScrapers.m[cfg]
	if sh == nil {
		s, err := newPullScraper(set, cfg)
		if err != nil {
			return nil, err
		}
		sh = &sharedScraper{s: s}
		sharedScrapers.m[cfg] = sh
	}
	sh.mu.Lock()
	sh.leases++
	sh.mu.Unlock()
	return &lease{shared: sh, cfg: cfg}, nil
}

// start connects on the first Start among the scraper's receivers.
func (l *lease) start(ctx context.Context, host component.Host) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.done {
		return nil
	}
	sh := l.shared
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.started == 0 {
		if err := sh.s.start(ctx, host); err != nil {
			return err
		}
	}
	sh.started++
	l.started = true
	return nil
}

// shutdown releases the lease. The last started receiver shuts the scraper down (pending
// acknowledgements, then the connection); an earlier one only sends its own signal's pending
// acknowledgement with finalAck. Safe without start, and more than once.
func (l *lease) shutdown(ctx context.Context, finalAck func(context.Context)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return nil
	}
	l.done = true
	sh := l.shared
	var err error
	if l.started {
		sh.mu.Lock()
		sh.started--
		if sh.started == 0 {
			err = sh.s.shutdown(ctx)
		} else if finalAck != nil {
			finalAck(ctx)
		}
		sh.mu.Unlock()
	}
	// Lock order: sharedScrapers, then the scraper (as acquireScraper).
	sharedScrapers.mu.Lock()
	defer sharedScrapers.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.leases--
	if sh.leases == 0 && sharedScrapers.m[l.cfg] == sh {
		delete(sharedScrapers.m, l.cfg)
	}
	return err
}
