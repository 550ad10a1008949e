package gpumetricsreceiver

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configretry"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
)

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)

	subprocess := createDefaultConfig().(*Config)
	subprocess.Command = "gpumetrics"
	subprocess.Args = []string{"serve", "--simulate"}
	subprocess.Env = map[string]string{"PYTHONUNBUFFERED": "1"}
	subprocess.StartTimeout = 45 * time.Second
	subprocess.CollectionInterval = 5 * time.Second
	subprocess.Timeout = 4 * time.Second
	subprocess.RetryOnFailure.InitialInterval = 200 * time.Millisecond
	subprocess.RetryOnFailure.MaxInterval = 800 * time.Millisecond
	subprocess.RetryOnFailure.RandomizationFactor = 0.1
	subprocess.RetryOnFailure.MaxElapsedTime = 2 * time.Second

	remote := createDefaultConfig().(*Config)
	remote.Endpoint = "127.0.0.1:4319"
	remote.TLS.CAFile = "/etc/gpumetrics/ca.pem"
	remote.TLS.ServerName = "sidecar.local"
	remote.TokenFile = "/run/secrets/gpumetrics-pull-token"
	remote.Consumer = "node-collector"
	remote.MaxPullsPerScrape = 20
	remote.MaxDataPointsPerPull = 50000
	remote.MaxBytesPerPull = 8 << 20
	remote.MaxRecvMsgSizeMiB = 128
	remote.tlsKeys = []string{"ca_file", "server_name_override"}

	unixSocket := createDefaultConfig().(*Config)
	unixSocket.Endpoint = "unix:///run/gpumetrics/pull.sock"

	unixInsecure := createDefaultConfig().(*Config)
	unixInsecure.Endpoint = "unix:///run/gpumetrics/pull.sock"
	unixInsecure.TLS.Insecure = true
	unixInsecure.tlsKeys = []string{"insecure"}

	unixCAFile := createDefaultConfig().(*Config)
	unixCAFile.Endpoint = "unix:/run/gpumetrics/pull.sock"
	unixCAFile.TLS.CAFile = "/etc/gpumetrics/ca.pem"
	unixCAFile.TLS.ServerName = "sidecar.local"
	unixCAFile.tlsKeys = []string{"ca_file", "server_name_override"}

	unixInsecureFalse := createDefaultConfig().(*Config)
	unixInsecureFalse.Endpoint = "unix:///run/gpumetrics/pull.sock"
	unixInsecureFalse.tlsKeys = []string{"insecure"}

	tests := []struct {
		id       component.ID
		expected component.Config
		wantErr  string
	}{
		{
			id:       component.NewID(metadata.Type),
			expected: createDefaultConfig(),
			wantErr:  "one of 'command' (subprocess mode) or 'endpoint' (remote mode) must be set",
		},
		{id: component.NewIDWithName(metadata.Type, "subprocess"), expected: subprocess},
		{id: component.NewIDWithName(metadata.Type, "remote"), expected: remote},
		{id: component.NewIDWithName(metadata.Type, "unix"), expected: unixSocket},
		{id: component.NewIDWithName(metadata.Type, "unix_insecure"), expected: unixInsecure},
		{
			id: component.NewIDWithName(metadata.Type, "unix_ca_file"), expected: unixCAFile,
			wantErr: unixTLSError + "; remove 'tls::ca_file', 'tls::server_name_override'",
		},
		{
			id: component.NewIDWithName(metadata.Type, "unix_insecure_false"), expected: unixInsecureFalse,
			wantErr: unixTLSError + "; remove 'tls::insecure'",
		},
	}
	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			cfg := createDefaultConfig()
			sub, err := cm.Sub(tt.id.String())
			require.NoError(t, err)
			require.NoError(t, sub.Unmarshal(cfg))
			assert.Equal(t, tt.expected, cfg)
			err = confmap.Validate(cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
}

// unixTLSError is the start of Validate's message for TLS settings on a unix socket endpoint.
const unixTLSError = "'tls' cannot be used with a unix socket 'endpoint': the sidecar serves unix sockets in plaintext (protect them with the socket's file mode)"

func TestConfigStruct(t *testing.T) {
	require.NoError(t, componenttest.CheckConfigStruct(createDefaultConfig()))
}

func TestDefaultConfig(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	assert.Equal(t, 10*time.Second, cfg.CollectionInterval)
	assert.Equal(t, 10*time.Second, cfg.Timeout, "an explicit scrape timeout: scraperhelper's 0 means none")
	assert.Equal(t, time.Second, cfg.InitialDelay)
	assert.Equal(t, 30*time.Second, cfg.StartTimeout)
	assert.False(t, cfg.TLS.Insecure, "remote mode uses TLS unless told otherwise")
	assert.Equal(t, 10, cfg.MaxPullsPerScrape)
	assert.Equal(t, 64, cfg.MaxRecvMsgSizeMiB)
	retry := cfg.RetryOnFailure
	assert.True(t, retry.Enabled)
	assert.Equal(t, []any{100 * time.Millisecond, time.Second, 2.0, 0.2, time.Duration(0)},
		[]any{retry.InitialInterval, retry.MaxInterval, retry.Multiplier, retry.RandomizationFactor, retry.MaxElapsedTime})
	assert.Empty(t, cfg.Command)
	assert.Empty(t, cfg.Endpoint)
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		modify  func(*Config)
		wantErr string
	}{
		{name: "subprocess", modify: func(c *Config) { c.Command = "gpumetrics"; c.Args = []string{"serve"} }},
		{name: "remote tcp", modify: func(c *Config) { c.Endpoint = "localhost:4319" }},
		{name: "remote unix", modify: func(c *Config) { c.Endpoint = "unix:///run/g.sock" }},
		{name: "remote unix single slash", modify: func(c *Config) { c.Endpoint = "unix:/run/g.sock" }},
		{name: "no mode", modify: func(*Config) {}, wantErr: "one of 'command' (subprocess mode) or 'endpoint' (remote mode) must be set"},
		{name: "both modes", modify: func(c *Config) { c.Command = "gpumetrics"; c.Endpoint = "localhost:1" }, wantErr: "'command' and 'endpoint' cannot both be set"},
		{name: "zero timeout", modify: func(c *Config) { c.Command = "gpumetrics"; c.Timeout = 0 }, wantErr: "'timeout' must be greater than 0"},
		{name: "zero start_timeout", modify: func(c *Config) { c.Command = "gpumetrics"; c.StartTimeout = 0 }, wantErr: "'start_timeout' must be greater than 0"},
		{name: "command with spaces", modify: func(c *Config) { c.Command = "gpumetrics " }, wantErr: `'command' "gpumetrics " must not start or end with whitespace`},
		{name: "args as one string", modify: func(c *Config) { c.Command = "g"; c.Args = []string{"serve --plugin --simulate"} }, wantErr: `'args' [0] "serve --plugin --simulate" is one argument with spaces; write args as a list`},
		{name: "bad env key", modify: func(c *Config) { c.Command = "g"; c.Env = map[string]string{"A=B": "1"} }, wantErr: `'env' key "A=B" must be non-empty`},
		{name: "tls in subprocess mode", modify: func(c *Config) { c.Command = "g"; c.TLS.CAFile = "/ca.pem" }, wantErr: "'tls' applies only to remote mode"},
		{name: "args in remote mode", modify: func(c *Config) { c.Endpoint = "localhost:1"; c.Args = []string{"x"} }, wantErr: "'args' applies only to subprocess mode"},
		{name: "env in remote mode", modify: func(c *Config) { c.Endpoint = "localhost:1"; c.Env = map[string]string{"A": "1"} }, wantErr: "'env' applies only to subprocess mode"},
		{name: "endpoint without port", modify: func(c *Config) { c.Endpoint = "localhost" }, wantErr: `'endpoint' "localhost" must be host:port or unix:///absolute/path`},
		{name: "endpoint without host", modify: func(c *Config) { c.Endpoint = ":4319" }, wantErr: `'endpoint' ":4319" has no host`},
		{name: "endpoint bad port", modify: func(c *Config) { c.Endpoint = "localhost:0" }, wantErr: "port must be a number from 1 to 65535"},
		{name: "relative unix path", modify: func(c *Config) { c.Endpoint = "unix://run/g.sock" }, wantErr: "a unix socket needs an absolute path"},
		{name: "relative unix path, one colon", modify: func(c *Config) { c.Endpoint = "unix:run/g.sock" }, wantErr: "a unix socket needs an absolute path"},
		{name: "zero max recv", modify: func(c *Config) { c.Endpoint = "localhost:1"; c.MaxRecvMsgSizeMiB = 0 }, wantErr: "'max_recv_msg_size_mib' must be at least 1"},
		{name: "bad tls", modify: func(c *Config) { c.Endpoint = "localhost:1"; c.TLS.MinVersion = "9.9" }, wantErr: "'tls': "},
		{name: "tls over tcp", modify: func(c *Config) { c.Endpoint = "localhost:1"; c.TLS.CAFile = "/ca.pem" }},
		{name: "unix insecure", modify: func(c *Config) { c.Endpoint = "unix:///run/g.sock"; c.TLS.Insecure = true }},
		{name: "unix ca_file", modify: func(c *Config) { c.Endpoint = "unix:///run/g.sock"; c.TLS.CAFile = "/ca.pem" }, wantErr: unixTLSError},
		{name: "unix ca_pem", modify: func(c *Config) { c.Endpoint = "unix:/run/g.sock"; c.TLS.CAPem = "pem" }, wantErr: unixTLSError},
		{name: "unix client cert", modify: func(c *Config) {
			c.Endpoint = "unix:///run/g.sock"
			c.TLS.CertFile = "/c.pem"
			c.TLS.KeyFile = "/k.pem"
		}, wantErr: unixTLSError},
		{name: "unix insecure_skip_verify", modify: func(c *Config) { c.Endpoint = "unix:///run/g.sock"; c.TLS.InsecureSkipVerify = true }, wantErr: unixTLSError},
		{name: "unix material with insecure", modify: func(c *Config) { c.Endpoint = "unix:///run/g.sock"; c.TLS.Insecure = true; c.TLS.ServerName = "s" }, wantErr: unixTLSError},
		{name: "unix explicit insecure false", modify: func(c *Config) { c.Endpoint = "unix:///run/g.sock"; c.tlsKeys = []string{"insecure"} }, wantErr: unixTLSError + "; remove 'tls::insecure'"},
		{name: "unix explicit insecure true", modify: func(c *Config) {
			c.Endpoint = "unix:///run/g.sock"
			c.TLS.Insecure = true
			c.tlsKeys = []string{"insecure"}
		}},
		{name: "token and token_file", modify: func(c *Config) { c.Command = "g"; c.Token = "a"; c.TokenFile = "/t" }, wantErr: "'token' and 'token_file' cannot both be set"},
		{name: "bad consumer", modify: func(c *Config) { c.Command = "g"; c.Consumer = "a b" }, wantErr: `'consumer' "a b" must be at most 128 bytes of [A-Za-z0-9._:/-]`},
		{name: "zero pulls", modify: func(c *Config) { c.Command = "g"; c.MaxPullsPerScrape = 0 }, wantErr: "'max_pulls_per_scrape' must be between 1 and 1000, got 0"},
		{name: "retries off", modify: func(c *Config) {
			c.Command = "g"
			c.RetryOnFailure = configretry.BackOffConfig{Enabled: false}
		}},
		{name: "retry jitter above 1", modify: func(c *Config) { c.Command = "g"; c.RetryOnFailure.RandomizationFactor = 1.5 }, wantErr: "'retry_on_failure': randomization_factor value must be less than or equal to 1"},
		{name: "retry max_elapsed_time below initial", modify: func(c *Config) { c.Command = "g"; c.RetryOnFailure.MaxElapsedTime = 50 * time.Millisecond }, wantErr: "'retry_on_failure': 'max_elapsed_time' must not be less than 'initial_interval'"},
		{name: "retry zero initial_interval", modify: func(c *Config) { c.Command = "g"; c.RetryOnFailure.InitialInterval = 0 }, wantErr: "'retry_on_failure::initial_interval' must be greater than 0 when retries are enabled, got 0s"},
		{name: "retry multiplier below 1", modify: func(c *Config) { c.Command = "g"; c.RetryOnFailure.Multiplier = 0.5 }, wantErr: "'retry_on_failure::multiplier' must be at least 1, got 0.5"},
		{name: "retry max_interval below initial", modify: func(c *Config) { c.Command = "g"; c.RetryOnFailure.MaxInterval = 10 * time.Millisecond }, wantErr: "'retry_on_failure::max_interval' (10ms) must not be less than 'retry_on_failure::initial_interval' (100ms)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := createDefaultConfig().(*Config)
			tt.modify(cfg)
			err := cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}
