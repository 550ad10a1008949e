package gpumetricsreceiver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/config/configopaque"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
)

func TestRemoteBearerToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600))
	wrongFile := filepath.Join(t.TempDir(), "wrong")
	require.NoError(t, os.WriteFile(wrongFile, []byte("nope"), 0o600))
	tests := []struct {
		name      string
		token     string
		tokenFile string
		wantCode  codes.Code
	}{
		{name: "token", token: "s3cret", wantCode: codes.OK},
		{name: "token_file", tokenFile: tokenFile, wantCode: codes.OK},
		{name: "wrong token_file", tokenFile: wrongFile, wantCode: codes.Unauthenticated},
		{name: "wrong token", token: "s3cret2", wantCode: codes.Unauthenticated},
		{name: "no token", wantCode: codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakesidecar.New(fakesidecar.Options{Token: "s3cret"})
			appendBatches(fake, 1, 1)
			cfg := remoteConfig(serveTCP(t, fake))
			cfg.Token = configopaque.String(tt.token)
			cfg.TokenFile = tt.tokenFile
			s := newScraper(t, newTestEnv(t), cfg)
			next := newScriptedConsumer()

			scrapeErr, _ := cycle(s, next)
			assert.Equal(t, tt.wantCode, status.Code(errors.Unwrap(scrapeErr)), "scrape error: %v", scrapeErr)
			if tt.wantCode == codes.OK {
				assert.Equal(t, []string{"b1"}, next.batchLabels())
			} else {
				assert.Empty(t, next.batchLabels())
			}
		})
	}
}

func TestRemoteTLS(t *testing.T) {
	pki := newTestPKI(t)
	tests := []struct {
		name     string
		tls      func(cfg *Config)
		wantCode codes.Code
		wantErr  string
	}{
		{name: "test CA", tls: func(cfg *Config) { cfg.TLS.Insecure = false; cfg.TLS.CAFile = pki.caFile }},
		{
			name: "system roots", tls: func(cfg *Config) { cfg.TLS.Insecure = false },
			wantCode: codes.DeadlineExceeded, wantErr: "certificate signed by unknown authority",
		},
		{
			name: "plaintext", tls: func(cfg *Config) { cfg.TLS.Insecure = true },
			wantCode: codes.DeadlineExceeded, wantErr: "pull from the gpumetrics sidecar",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakesidecar.New(fakesidecar.Options{})
			appendBatches(fake, 1, 1)
			cfg := remoteConfig(serveTCP(t, fake, pki.serverOption()))
			tt.tls(cfg)
			s := newScraper(t, newTestEnv(t), cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			md, err := s.scrape(ctx)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.Equal(t, tt.wantCode, status.Code(errors.Unwrap(err)))
				assert.Empty(t, fake.Requests(), "no request reached the sidecar")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, 1, md.DataPointCount())
		})
	}
}

// TestRemoteUnixSocketIsPlaintext: a unix socket endpoint is dialled in plaintext without any
// `tls` block (the sidecar never serves TLS there), and `tls: {insecure: true}` still works.
// With TLS on by default the handshake would fail ("tls: first record does not look like a TLS
// handshake") and the scrape would end in DEADLINE_EXCEEDED.
func TestRemoteUnixSocketIsPlaintext(t *testing.T) {
	tests := []struct {
		name     string
		insecure bool
		endpoint func(string) string
	}{
		{name: "no tls block", endpoint: func(e string) string { return e }},
		{name: "no tls block, unix:/path", endpoint: func(e string) string { return "unix:" + strings.TrimPrefix(e, "unix://") }},
		{name: "insecure true", insecure: true, endpoint: func(e string) string { return e }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakesidecar.New(fakesidecar.Options{})
			appendBatches(fake, 1, 1)
			cfg := createDefaultConfig().(*Config)
			cfg.Endpoint = tt.endpoint(serveUnix(t, fake))
			cfg.TLS.Insecure = tt.insecure
			cfg.InitialDelay = 0
			env := newTestEnv(t)
			s := newScraper(t, env, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()

			md, err := s.scrape(ctx)
			require.NoError(t, err)
			assert.Equal(t, 1, md.DataPointCount())
			require.Len(t, fake.Requests(), 1)
			assert.Empty(t, env.logs.FilterLevelExact(zapcore.WarnLevel).All(), "nothing to warn about")
		})
	}
}
