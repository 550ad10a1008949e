// Package sidecarconn holds what the gpumetrics receiver and the gpumetrics exporter share about
// reaching a gpumetrics sidecar over gRPC: the accepted endpoint forms, the rule that a unix
// socket is always plaintext (the sidecar serves no TLS there, docs/security.md), bearer tokens
// read from a file, and the client connection's dial options. Error messages quote the YAML keys
// of both components' configurations (`endpoint`, `tls`, `token_file`).
package sidecarconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/config/configopaque"
	"go.opentelemetry.io/collector/config/configtls"
	"go.opentelemetry.io/collector/confmap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ClientSettings are the settings of a component that dials the sidecar, squashed into its
// Config (`mapstructure:",squash"`): the same four YAML keys in the receiver and the exporter.
type ClientSettings struct {
	// Endpoint is the sidecar's address: "host:port", "unix:///absolute/path" or
	// "unix:/absolute/path".
	Endpoint string `mapstructure:"endpoint"`
	// TLS holds the client TLS settings over TCP. TLS is used unless `insecure: true`, as in
	// the Collector's OTLP exporter. A unix socket endpoint is always dialled in plaintext (the
	// sidecar never serves TLS there: docs/security.md), and TLS settings with it are a
	// validation error.
	TLS configtls.ClientConfig `mapstructure:"tls"`
	// Token is a bearer token sent as "authorization: Bearer <token>" (a pull token for the
	// receiver, a declare token for the exporter).
	Token configopaque.String `mapstructure:"token"`
	// TokenFile is a file holding the bearer token (surrounding whitespace is ignored), read
	// again for every use (each scrape, each new stream), so a rotated token is picked up.
	TokenFile string `mapstructure:"token_file"`
}

// unixScheme starts a unix socket endpoint ("unix:///abs/path" or "unix:/abs/path").
const unixScheme = "unix:"

// IsUnix reports whether endpoint names a unix socket ("unix:///path" or "unix:/path").
func IsUnix(endpoint string) bool { return strings.HasPrefix(endpoint, unixScheme) }

// ValidateEndpoint accepts "host:port" (port 1-65535), "unix:///absolute/path" or
// "unix:/absolute/path" (the sidecar's --listen spelling); gRPC reads both unix forms.
// example is a unix endpoint quoted in the error for a relative path, e.g.
// "unix:///run/gpumetrics/pull.sock".
func ValidateEndpoint(endpoint, example string) error {
	if rest, ok := strings.CutPrefix(endpoint, unixScheme); ok {
		path := rest
		if p, ok := strings.CutPrefix(rest, "//"); ok {
			path = p // unix:///abs -> /abs
		}
		if !filepath.IsAbs(path) {
			return fmt.Errorf("'endpoint' %q: a unix socket needs an absolute path, as in %s", endpoint, example)
		}
		return nil
	}
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return fmt.Errorf("'endpoint' %q must be host:port or unix:///absolute/path: %w", endpoint, err)
	}
	if host == "" {
		return fmt.Errorf("'endpoint' %q has no host", endpoint)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("'endpoint' %q: port must be a number from 1 to 65535", endpoint)
	}
	return nil
}

// IsLocal reports whether endpoint is a unix socket or a loopback address.
func IsLocal(endpoint string) bool {
	if IsUnix(endpoint) {
		return true
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TLSKeys returns the keys given under `tls` in a component's YAML (sorted, nested ones joined
// with "::"), or nil when there is no `tls` block. A component's Unmarshal records them so that
// ValidateUnixTLS can tell an explicit `insecure: false` from the default.
func TLSKeys(conf *confmap.Conf) []string {
	tlsConf, err := conf.Sub("tls")
	if err != nil {
		return nil
	}
	keys := tlsConf.AllKeys()
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	return keys
}

// ValidateUnixTLS refuses TLS settings with a unix socket endpoint: the sidecar serves its unix
// sockets in plaintext even when it serves TLS on TCP (docs/security.md, "TLS and mTLS"), so a
// TLS client there fails every handshake. Only `tls: {insecure: true}` is accepted. tlsKeys are
// the keys given in the YAML (TLSKeys); the message names the ones to remove.
func ValidateUnixTLS(cfg configtls.ClientConfig, tlsKeys []string) error {
	material := cfg
	material.Insecure = false
	explicitTLS := slices.Contains(tlsKeys, "insecure") && !cfg.Insecure
	if !explicitTLS && reflect.DeepEqual(material, configtls.NewDefaultClientConfig()) {
		return nil
	}
	msg := "'tls' cannot be used with a unix socket 'endpoint': the sidecar serves unix sockets in plaintext (protect them with the socket's file mode)"
	var given []string
	for _, key := range tlsKeys {
		if key != "insecure" || !cfg.Insecure {
			given = append(given, "'tls::"+key+"'")
		}
	}
	if len(given) > 0 {
		msg += "; remove " + strings.Join(given, ", ")
	}
	return errors.New(msg)
}

// ValidateClient checks `endpoint`, `tls`, `token` and `token_file` of a component that dials
// the sidecar; example is quoted for a relative unix socket path (see ValidateEndpoint).
func ValidateClient(endpoint string, tlsCfg configtls.ClientConfig, tlsKeys []string, token configopaque.String, tokenFile, example string) []error {
	var errs []error
	if err := ValidateEndpoint(endpoint, example); err != nil {
		errs = append(errs, err)
	}
	if IsUnix(endpoint) {
		if err := ValidateUnixTLS(tlsCfg, tlsKeys); err != nil {
			errs = append(errs, err)
		}
	} else if err := tlsCfg.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("'tls': %w", err))
	}
	if token != "" && tokenFile != "" {
		errs = append(errs, errors.New("'token' and 'token_file' cannot both be set"))
	}
	return errs
}

// Token returns the bearer token: token itself, or the content of tokenFile (surrounding
// whitespace ignored) read afresh on every call, so a rotated token is picked up. "" when neither
// is configured. Errors name `token_file`: unreadable, or empty.
func Token(token configopaque.String, tokenFile string) (string, error) {
	if tokenFile == "" {
		return string(token), nil
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return "", fmt.Errorf("'token_file': %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("'token_file' %q is empty", tokenFile)
	}
	return tok, nil
}

// LoadTLS returns the client TLS configuration for endpoint: nil (plaintext) for a unix socket,
// else tlsCfg loaded (nil when `insecure: true`). Errors are prefixed with 'tls'.
func LoadTLS(ctx context.Context, endpoint string, tlsCfg configtls.ClientConfig) (*tls.Config, error) {
	if IsUnix(endpoint) {
		return nil, nil
	}
	c, err := tlsCfg.LoadTLSConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("'tls': %w", err)
	}
	return c, nil
}

// reconnectBackoff keeps reconnection attempts to a restarted sidecar frequent: gRPC's default
// backoff grows to 2 minutes, longer than many collection intervals.
var reconnectBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}

// minConnectTimeout bounds one connection attempt.
const minConnectTimeout = 5 * time.Second

// Dial creates a lazy gRPC client connection to target ("host:port" or "unix:///path"): TLS when
// tlsCfg is not nil, plaintext otherwise, reconnecting with a short backoff (100 ms growing
// ×1.6 up to 5 s). extra options come last. It does not contact the sidecar.
func Dial(target string, tlsCfg *tls.Config, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff, MinConnectTimeout: minConnectTimeout}),
	}, extra...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("sidecar endpoint %q: %w", target, err)
	}
	return conn, nil
}
