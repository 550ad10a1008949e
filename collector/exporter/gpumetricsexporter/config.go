package gpumetricsexporter

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"time"

	"go.opentelemetry.io/collector/confmap"

	"github.com/gpumetrics/gpumetrics/collector/internal/sidecarconn"
)

const (
	defaultProcRoot          = "/proc"
	defaultMaxProcesses      = 32768
	defaultExitCheckInterval = 10 * time.Second
	defaultExpireAfter       = 30 * time.Minute

	maxMaxProcesses = 1 << 20
	maxDeclarerLen  = 128
	exampleEndpoint = "unix:///run/gpumetrics/profiler.sock"
)

// declarerPattern is the sidecar's rule for the gpumetrics-declarer metadata (docs/protocol.md).
var declarerPattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]+$`)

// Config is the gpumetrics exporter's configuration.
type Config struct {
	// ClientSettings: `endpoint`, the sidecar's profiler listener (its main listener, or
	// server.profiler_listen when set); `tls`; and the declare token sent on every declaration
	// stream (`token` or `token_file`, read at start and for every new stream).
	sidecarconn.ClientSettings `mapstructure:",squash"`
	// Declarer is the gpumetrics-declarer name this exporter declares under; a resync replaces
	// what this name declared. Empty means the component ID (e.g. "gpumetrics/profiles").
	Declarer string `mapstructure:"declarer"`
	// ProcRoot is where the pids of profiles are looked up (start time, exit detection): the
	// profiler's pid namespace, e.g. /host/proc in a container that mounts the host's procfs.
	// Empty: no start times are read (declarations match on pid alone) and processes are only
	// released by expire_after.
	ProcRoot string `mapstructure:"proc_root"`
	// MaxProcesses bounds the processes held; a profile of a new process beyond it is not
	// declared (counted, reason capacity).
	MaxProcesses int `mapstructure:"max_processes"`
	// ExitCheckInterval is how often held pids are checked in proc_root (gone or restarted) and
	// for expiry.
	ExitCheckInterval time.Duration `mapstructure:"exit_check_interval"`
	// ExpireAfter releases a process that had no profile for this long.
	ExpireAfter time.Duration `mapstructure:"expire_after"`

	// tlsKeys are the keys given under `tls` (sidecarconn.TLSKeys), recorded by Unmarshal.
	tlsKeys []string

	// prevent unkeyed literal initialization
	_ struct{}
}

// Unmarshal decodes the exporter's YAML into cfg and records which `tls` keys were given (an
// explicit `insecure: false` asks for TLS on a unix socket, which Validate refuses).
func (cfg *Config) Unmarshal(conf *confmap.Conf) error {
	if err := conf.Unmarshal(cfg); err != nil {
		return err
	}
	cfg.tlsKeys = sidecarconn.TLSKeys(conf)
	return nil
}

// Validate checks the configuration; each message quotes the offending YAML key.
func (cfg *Config) Validate() error {
	var errs []error
	if cfg.Endpoint == "" {
		errs = append(errs, fmt.Errorf("'endpoint' must be set: the sidecar's profiler listener, e.g. %s", exampleEndpoint))
	} else {
		errs = append(errs, sidecarconn.ValidateClient(cfg.Endpoint, cfg.TLS, cfg.tlsKeys, cfg.Token, cfg.TokenFile, exampleEndpoint)...)
	}
	if cfg.Declarer != "" && (len(cfg.Declarer) > maxDeclarerLen || !declarerPattern.MatchString(cfg.Declarer)) {
		errs = append(errs, fmt.Errorf("'declarer' %q must be 1 to %d characters of [A-Za-z0-9._:/-]", cfg.Declarer, maxDeclarerLen))
	}
	if cfg.ProcRoot != "" && !filepath.IsAbs(cfg.ProcRoot) {
		errs = append(errs, fmt.Errorf("'proc_root' %q must be an absolute path (or empty to read no start times)", cfg.ProcRoot))
	}
	if cfg.MaxProcesses < 1 || cfg.MaxProcesses > maxMaxProcesses {
		errs = append(errs, fmt.Errorf("'max_processes' must be between 1 and %d, got %d", maxMaxProcesses, cfg.MaxProcesses))
	}
	if cfg.ExitCheckInterval <= 0 {
		errs = append(errs, errors.New("'exit_check_interval' must be greater than 0"))
	}
	if cfg.ExpireAfter < cfg.ExitCheckInterval {
		errs = append(errs, fmt.Errorf("'expire_after' (%s) must be at least 'exit_check_interval' (%s)", cfg.ExpireAfter, cfg.ExitCheckInterval))
	}
	return errors.Join(errs...)
}
