package gpumetricsexporter

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/gpumetrics/gpumetrics/collector/exporter/gpumetricsexporter/internal/metadata"
)

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)

	unix := createDefaultConfig().(*Config)
	unix.Endpoint = "unix:///run/gpumetrics/profiler.sock"

	full := createDefaultConfig().(*Config)
	full.Endpoint = "gpumetrics-sidecar:4319"
	full.TLS.CAFile = "/etc/gpumetrics/ca.pem"
	full.TokenFile = "/run/secrets/gpumetrics-declare-token"
	full.Declarer = "otelcol/node-7"
	full.ProcRoot = "/host/proc"
	full.MaxProcesses = 1000
	full.ExitCheckInterval = 5 * time.Second
	full.ExpireAfter = 10 * time.Minute
	full.tlsKeys = []string{"ca_file"}

	noProcRoot := createDefaultConfig().(*Config)
	noProcRoot.Endpoint = "127.0.0.1:4319"
	noProcRoot.TLS.Insecure = true
	noProcRoot.ProcRoot = ""
	noProcRoot.tlsKeys = []string{"insecure"}

	unixTLS := createDefaultConfig().(*Config)
	unixTLS.Endpoint = "unix:///run/gpumetrics/profiler.sock"
	unixTLS.TLS.CAFile = "/etc/gpumetrics/ca.pem"
	unixTLS.tlsKeys = []string{"ca_file"}

	tests := []struct {
		id       component.ID
		expected component.Config
		wantErr  string
	}{
		{id: component.NewID(metadata.Type), expected: createDefaultConfig(), wantErr: "'endpoint' must be set: the sidecar's profiler listener, e.g. unix:///run/gpumetrics/profiler.sock"},
		{id: component.NewIDWithName(metadata.Type, "unix"), expected: unix},
		{id: component.NewIDWithName(metadata.Type, "full"), expected: full},
		{id: component.NewIDWithName(metadata.Type, "no_proc_root"), expected: noProcRoot},
		{
			id: component.NewIDWithName(metadata.Type, "unix_tls"), expected: unixTLS,
			wantErr: "'tls' cannot be used with a unix socket 'endpoint': the sidecar serves unix sockets in plaintext (protect them with the socket's file mode); remove 'tls::ca_file'",
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

func TestConfigStruct(t *testing.T) {
	require.NoError(t, componenttest.CheckConfigStruct(createDefaultConfig()))
}

func TestDefaultConfig(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	assert.Empty(t, cfg.Endpoint)
	assert.False(t, cfg.TLS.Insecure, "TLS over TCP unless told otherwise")
	assert.Equal(t, "/proc", cfg.ProcRoot)
	assert.Equal(t, 32768, cfg.MaxProcesses)
	assert.Equal(t, 10*time.Second, cfg.ExitCheckInterval)
	assert.Equal(t, 30*time.Minute, cfg.ExpireAfter)
}

func TestValidate(t *testing.T) {
	valid := func() *Config {
		cfg := createDefaultConfig().(*Config)
		cfg.Endpoint = "unix:///run/gpumetrics/profiler.sock"
		return cfg
	}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"relative unix path", func(c *Config) { c.Endpoint = "unix:run/p.sock" }, `'endpoint' "unix:run/p.sock": a unix socket needs an absolute path, as in unix:///run/gpumetrics/profiler.sock`},
		{"no port", func(c *Config) { c.Endpoint = "localhost" }, `'endpoint' "localhost" must be host:port or unix:///absolute/path`},
		{"bad port", func(c *Config) { c.Endpoint = "127.0.0.1:0" }, `'endpoint' "127.0.0.1:0": port must be a number from 1 to 65535`},
		{"token and token_file", func(c *Config) { c.Token = "t"; c.TokenFile = "/f" }, "'token' and 'token_file' cannot both be set"},
		{"declarer", func(c *Config) { c.Declarer = "my agent" }, `'declarer' "my agent" must be 1 to 128 characters of [A-Za-z0-9._:/-]`},
		{"relative proc_root", func(c *Config) { c.ProcRoot = "proc" }, `'proc_root' "proc" must be an absolute path (or empty to read no start times)`},
		{"max_processes", func(c *Config) { c.MaxProcesses = 0 }, "'max_processes' must be between 1 and 1048576, got 0"},
		{"exit_check_interval", func(c *Config) { c.ExitCheckInterval = 0 }, "'exit_check_interval' must be greater than 0"},
		{"expire_after", func(c *Config) { c.ExpireAfter = time.Second }, "'expire_after' (1s) must be at least 'exit_check_interval' (10s)"},
	}
	require.NoError(t, valid().Validate())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.change(cfg)
			require.ErrorContains(t, cfg.Validate(), tt.wantErr)
		})
	}
}
