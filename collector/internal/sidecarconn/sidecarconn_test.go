package sidecarconn

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/config/configtls"
	"go.opentelemetry.io/collector/confmap"
)

func TestEndpoints(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:4319", "[::1]:1", "sidecar:65535", "unix:///run/g.sock", "unix:/run/g.sock"} {
		assert.NoError(t, ValidateEndpoint(ok, "unix:///x"), ok)
	}
	assert.EqualError(t, ValidateEndpoint("unix:rel.sock", "unix:///run/gpumetrics/profiler.sock"),
		`'endpoint' "unix:rel.sock": a unix socket needs an absolute path, as in unix:///run/gpumetrics/profiler.sock`)
	assert.ErrorContains(t, ValidateEndpoint(":4319", "unix:///x"), `'endpoint' ":4319" has no host`)
	assert.ErrorContains(t, ValidateEndpoint("h:70000", "unix:///x"), "port must be a number from 1 to 65535")

	assert.True(t, IsLocal("unix:///run/g.sock"))
	assert.True(t, IsLocal("localhost:1"))
	assert.True(t, IsLocal("[::1]:1"))
	assert.True(t, IsLocal("127.0.0.2:1"))
	assert.False(t, IsLocal("10.0.0.1:1"))
	assert.False(t, IsLocal("sidecar:1"))
}

func TestToken(t *testing.T) {
	tok, err := Token("inline", "")
	require.NoError(t, err)
	assert.Equal(t, "inline", tok)

	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(file, []byte("  from-file-0123456789\n"), 0o600))
	tok, err = Token("", file)
	require.NoError(t, err)
	assert.Equal(t, "from-file-0123456789", tok)

	require.NoError(t, os.WriteFile(file, []byte(" \n"), 0o600))
	_, err = Token("", file)
	assert.EqualError(t, err, `'token_file' "`+file+`" is empty`)
	_, err = Token("", filepath.Join(dir, "missing"))
	assert.ErrorContains(t, err, "'token_file': open ")
}

func TestUnixTLSAndKeys(t *testing.T) {
	conf := confmap.NewFromStringMap(map[string]any{"tls": map[string]any{"insecure": true, "ca_file": "/ca.pem"}})
	keys := TLSKeys(conf)
	assert.Equal(t, []string{"ca_file", "insecure"}, keys)
	assert.Nil(t, TLSKeys(confmap.NewFromStringMap(map[string]any{"endpoint": "x"})))

	cfg := configtls.NewDefaultClientConfig()
	assert.NoError(t, ValidateUnixTLS(cfg, nil))
	cfg.Insecure = true
	assert.NoError(t, ValidateUnixTLS(cfg, []string{"insecure"}), "insecure: true is accepted")
	cfg.CAFile = "/ca.pem"
	assert.ErrorContains(t, ValidateUnixTLS(cfg, keys), "; remove 'tls::ca_file'")

	tlsCfg, err := LoadTLS(context.Background(), "unix:///run/g.sock", cfg)
	require.NoError(t, err)
	assert.Nil(t, tlsCfg, "a unix socket is always plaintext")
	_, err = LoadTLS(context.Background(), "127.0.0.1:1", configtls.ClientConfig{Config: configtls.Config{CAFile: "/nonexistent/ca.pem"}})
	assert.ErrorContains(t, err, "'tls': ")

	errs := ValidateClient("unix:///run/g.sock", cfg, keys, "t", "/f", "unix:///x")
	require.Len(t, errs, 2)
	assert.ErrorContains(t, errs[1], "'token' and 'token_file' cannot both be set")
}
