package gpumetricsreceiver

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/collector/config/configretry"
	"go.opentelemetry.io/collector/config/configtls"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/scraper/scraperhelper"

	"github.com/gpumetrics/gpumetrics/collector/internal/sidecarconn"
)

const (
	defaultCollectionInterval = 10 * time.Second
	defaultTimeout            = 10 * time.Second
	defaultStartTimeout       = 30 * time.Second
	defaultMaxPullsPerScrape  = 10
	defaultMaxRecvMsgSizeMiB  = 64

	maxMaxPullsPerScrape = 1000
	maxConsumerLen       = 128
)

// consumerPattern is the sidecar's rule for PullRequest.consumer (proto/gpumetrics/v1/pull.proto).
var consumerPattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]*$`)

// Config is the gpumetrics receiver's configuration. Exactly one mode is chosen:
//
//   - subprocess mode (`command` set): the receiver starts the sidecar as a go-plugin subprocess
//     and stops it at shutdown;
//   - remote mode (`endpoint` set): the receiver connects to a sidecar that runs on its own.
type Config struct {
	scraperhelper.ControllerConfig `mapstructure:",squash"`

	// Command is the sidecar executable for subprocess mode (a path, or a name looked up in
	// PATH), e.g. "gpumetrics". It is executed directly, never through a shell.
	Command string `mapstructure:"command"`
	// Args are the sidecar's arguments in subprocess mode, e.g. ["serve", "--simulate"].
	Args []string `mapstructure:"args"`
	// Env is added to the sidecar's environment in subprocess mode; it overrides the Collector's
	// own environment for the same keys.
	Env map[string]string `mapstructure:"env"`
	// StartTimeout bounds the wait for the sidecar's go-plugin handshake in subprocess mode.
	StartTimeout time.Duration `mapstructure:"start_timeout"`

	// ClientSettings: `endpoint` (remote mode: the address of a running sidecar), `tls` (remote
	// mode over TCP), and the pull token sent on every Pull (`token` or `token_file`, read
	// before every scrape).
	sidecarconn.ClientSettings `mapstructure:",squash"`

	// Consumer is the consumer name the sidecar keeps this receiver's cursor under. Empty means
	// the receiver's component ID (e.g. "gpumetrics/remote"). Two receivers pulling from one
	// sidecar must use different names.
	Consumer string `mapstructure:"consumer"`
	// MaxPullsPerScrape bounds the Pull calls of one scrape while the sidecar says `more`.
	MaxPullsPerScrape int `mapstructure:"max_pulls_per_scrape"`
	// MaxDataPointsPerPull is sent as PullRequest.max_data_points (0 = the sidecar's default).
	MaxDataPointsPerPull uint32 `mapstructure:"max_data_points_per_pull"`
	// MaxBytesPerPull is sent as PullRequest.max_bytes (0 = the sidecar's default).
	MaxBytesPerPull uint64 `mapstructure:"max_bytes_per_pull"`
	// MaxRecvMsgSizeMiB bounds one PullResponse in remote mode, in MiB (gRPC's default is 4).
	MaxRecvMsgSizeMiB int `mapstructure:"max_recv_msg_size_mib"`
	// RetryOnFailure is how a Pull the sidecar answers UNAVAILABLE (starting, restarting, not
	// stored yet) is retried within the scrape: the Collector's backoff settings, as for the
	// exporters' `retry_on_failure`, bounded by the scrape's `timeout` (retry.go).
	RetryOnFailure configretry.BackOffConfig `mapstructure:"retry_on_failure"`

	// tlsKeys are the keys given under `tls` in the YAML (sorted, nested ones joined with
	// "::"), recorded by Unmarshal so that Validate can tell an explicit `insecure: false` from
	// the default and name what to remove. Nil for a configuration built in code.
	tlsKeys []string

	// prevent unkeyed literal initialization
	_ struct{}
}

// Unmarshal decodes the receiver's YAML into cfg (confmap calls it instead of decoding cfg
// directly) and records which `tls` keys were given: `insecure: false` is also the default,
// and only an explicit one asks for TLS on a unix socket endpoint.
func (cfg *Config) Unmarshal(conf *confmap.Conf) error {
	if err := conf.Unmarshal(cfg); err != nil {
		return err
	}
	cfg.tlsKeys = sidecarconn.TLSKeys(conf)
	return nil
}

// subprocessMode reports whether the configuration selects subprocess mode.
func (cfg *Config) subprocessMode() bool { return cfg.Command != "" }

// Validate checks the configuration; each message quotes the offending YAML key. The embedded
// controller settings (`collection_interval`, `initial_delay`) are validated by scraperhelper.
func (cfg *Config) Validate() error {
	var errs []error
	switch {
	case cfg.Command == "" && cfg.Endpoint == "":
		errs = append(errs, errors.New("one of 'command' (subprocess mode) or 'endpoint' (remote mode) must be set"))
	case cfg.Command != "" && cfg.Endpoint != "":
		errs = append(errs, errors.New("'command' and 'endpoint' cannot both be set: choose subprocess or remote mode"))
	case cfg.subprocessMode():
		errs = append(errs, cfg.validateSubprocess()...)
	default:
		errs = append(errs, cfg.validateRemote()...)
	}
	if cfg.Timeout <= 0 {
		errs = append(errs, errors.New("'timeout' must be greater than 0: a scrape without a deadline can hang on a stuck sidecar"))
	}
	if cfg.Token != "" && cfg.TokenFile != "" {
		errs = append(errs, errors.New("'token' and 'token_file' cannot both be set"))
	}
	if len(cfg.Consumer) > maxConsumerLen || !consumerPattern.MatchString(cfg.Consumer) {
		errs = append(errs, fmt.Errorf("'consumer' %q must be at most %d bytes of [A-Za-z0-9._:/-]", cfg.Consumer, maxConsumerLen))
	}
	if cfg.MaxPullsPerScrape < 1 || cfg.MaxPullsPerScrape > maxMaxPullsPerScrape {
		errs = append(errs, fmt.Errorf("'max_pulls_per_scrape' must be between 1 and %d, got %d", maxMaxPullsPerScrape, cfg.MaxPullsPerScrape))
	}
	errs = append(errs, validateRetry(cfg.RetryOnFailure)...)
	return errors.Join(errs...)
}

// validateRetry checks `retry_on_failure`: configretry's own rules (their messages name the
// keys under it), and, when enabled, waits that grow from a positive start: a zero
// `initial_interval` or a `multiplier` below 1 would resend Pulls to a sidecar that is starting
// as fast as it answers, for most of the scrape.
func validateRetry(r configretry.BackOffConfig) []error {
	var errs []error
	if err := r.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("'retry_on_failure': %w", err))
	}
	if !r.Enabled {
		return errs
	}
	if r.InitialInterval <= 0 {
		errs = append(errs, fmt.Errorf("'retry_on_failure::initial_interval' must be greater than 0 when retries are enabled, got %s", r.InitialInterval))
	}
	if r.Multiplier < 1 {
		errs = append(errs, fmt.Errorf("'retry_on_failure::multiplier' must be at least 1, got %g", r.Multiplier))
	}
	if r.MaxInterval < r.InitialInterval {
		errs = append(errs, fmt.Errorf("'retry_on_failure::max_interval' (%s) must not be less than 'retry_on_failure::initial_interval' (%s)", r.MaxInterval, r.InitialInterval))
	}
	return errs
}

func (cfg *Config) validateSubprocess() []error {
	var errs []error
	if strings.TrimSpace(cfg.Command) != cfg.Command {
		errs = append(errs, fmt.Errorf("'command' %q must not start or end with whitespace", cfg.Command))
	}
	if cfg.StartTimeout <= 0 {
		errs = append(errs, errors.New("'start_timeout' must be greater than 0"))
	}
	// The first argument is the sidecar's command (serve): one with spaces is a whole command
	// line given as one string (`args: "serve --plugin"`, which YAML decoding accepts as a
	// one-element list), and the sidecar would refuse it only at start.
	if len(cfg.Args) > 0 && strings.ContainsAny(cfg.Args[0], " \t\n") {
		errs = append(errs, fmt.Errorf("'args' [0] %q is one argument with spaces; write args as a list, one argument each: [serve, --plugin, ...]", cfg.Args[0]))
	}
	for key := range cfg.Env {
		if key == "" || strings.ContainsAny(key, "=\x00") {
			errs = append(errs, fmt.Errorf("'env' key %q must be non-empty and contain no '=' or NUL", key))
		}
	}
	if !reflect.DeepEqual(cfg.TLS, configtls.NewDefaultClientConfig()) {
		errs = append(errs, errors.New("'tls' applies only to remote mode ('endpoint'); the subprocess is reached over a private unix socket"))
	}
	return errs
}

func (cfg *Config) validateRemote() []error {
	var errs []error
	if err := validateEndpoint(cfg.Endpoint); err != nil {
		errs = append(errs, err)
	}
	if len(cfg.Args) > 0 {
		errs = append(errs, errors.New("'args' applies only to subprocess mode ('command')"))
	}
	if len(cfg.Env) > 0 {
		errs = append(errs, errors.New("'env' applies only to subprocess mode ('command')"))
	}
	if cfg.MaxRecvMsgSizeMiB < 1 {
		errs = append(errs, fmt.Errorf("'max_recv_msg_size_mib' must be at least 1, got %d", cfg.MaxRecvMsgSizeMiB))
	}
	if isUnixEndpoint(cfg.Endpoint) {
		// The sidecar serves unix sockets in plaintext (docs/security.md): refuse TLS there.
		if err := sidecarconn.ValidateUnixTLS(cfg.TLS, cfg.tlsKeys); err != nil {
			errs = append(errs, err)
		}
	} else if err := cfg.TLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("'tls': %w", err))
	}
	return errs
}

// isUnixEndpoint reports whether endpoint names a unix socket ("unix:///path" or "unix:/path").
func isUnixEndpoint(endpoint string) bool { return sidecarconn.IsUnix(endpoint) }

// validateEndpoint accepts "host:port" (port 1-65535), "unix:///absolute/path" or
// "unix:/absolute/path" (the sidecar's --listen spelling); gRPC reads both unix forms.
func validateEndpoint(endpoint string) error {
	return sidecarconn.ValidateEndpoint(endpoint, "unix:///run/gpumetrics/pull.sock")
}
