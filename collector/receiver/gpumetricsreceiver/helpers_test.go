package gpumetricsreceiver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/scraper/scrapererror"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/fakesidecar"
	"github.com/gpumetrics/gpumetrics/collector/receiver/gpumetricsreceiver/internal/metadata"
)

// testEnv is a receiver's settings with an observable logger and telemetry.
type testEnv struct {
	set       receiver.Settings
	logs      *observer.ObservedLogs
	telemetry *componenttest.Telemetry
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := receivertest.NewNopSettings(metadata.Type)
	set.ID = component.MustNewIDWithName(metadata.Type.String(), "test")
	set.TelemetrySettings = tel.NewTelemetrySettings()
	set.Logger = zap.New(core)
	return &testEnv{set: set, logs: logs, telemetry: tel}
}

// counter returns the sum of the internal telemetry counter name (0 when never recorded).
func (e *testEnv) counter(t *testing.T, name string) int64 {
	t.Helper()
	m, err := e.telemetry.GetMetric(name)
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range sumDataPoints(t, m) {
		total += dp
	}
	return total
}

// remoteConfig returns a valid remote-mode configuration for endpoint without TLS: `insecure:
// true` over TCP; nothing for a unix socket, which is always plaintext.
func remoteConfig(endpoint string) *Config {
	cfg := createDefaultConfig().(*Config)
	cfg.Endpoint = endpoint
	cfg.TLS.Insecure = !isUnixEndpoint(endpoint)
	cfg.InitialDelay = 0
	return cfg
}

// serve starts a gRPC server for fake on lis, stopped at the end of the test; an answer gRPC
// could not send is taken back, as the sidecar does (fakesidecar.TrackDeliveries).
func serve(t *testing.T, lis net.Listener, fake *fakesidecar.Server, opts ...grpc.ServerOption) {
	t.Helper()
	srv := grpc.NewServer(append([]grpc.ServerOption{fakesidecar.TrackDeliveries()}, opts...)...)
	gpumetricsv1.RegisterMetricsPullServiceServer(srv, fake)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("fake sidecar: %v", err)
		}
	})
}

// serveTCP serves fake on 127.0.0.1:0 and returns "127.0.0.1:<port>".
func serveTCP(t *testing.T, fake *fakesidecar.Server, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serve(t, lis, fake, opts...)
	return lis.Addr().String()
}

// serveUnix serves fake on a unix socket in t.TempDir() and returns "unix:///<path>".
func serveUnix(t *testing.T, fake *fakesidecar.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pull.sock")
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	serve(t, lis, fake)
	return "unix://" + path
}

// newScraper builds a pullScraper and starts it; it is shut down at the end of the test.
func newScraper(t *testing.T, env *testEnv, cfg *Config) *pullScraper {
	t.Helper()
	require.NoError(t, cfg.Validate())
	s, err := newPullScraper(env.set, cfg)
	require.NoError(t, err)
	require.NoError(t, s.start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, s.shutdown(context.Background())) })
	return s
}

// cycle runs one scrape and hands its result to next through the acknowledging consumer, as the
// scraper controller does. It returns the scrape error and the consumer error.
func cycle(s *pullScraper, next consumer.Metrics) (scrapeErr, consumeErr error) {
	return cycleCtx(context.Background(), s, next)
}

// cycleCtx is cycle with the scrape's context (its deadline stands for the controller's timeout).
func cycleCtx(ctx context.Context, s *pullScraper, next consumer.Metrics) (scrapeErr, consumeErr error) {
	md, scrapeErr := s.scrape(ctx)
	if scrapeErr != nil && !scrapererror.IsPartialScrapeError(scrapeErr) {
		// the controller drops a failed scraper's output but still calls the consumer
		md = pmetric.NewMetrics()
	}
	consumeErr = (&ackingConsumer{next: next, scraper: s}).ConsumeMetrics(context.Background(), md)
	return scrapeErr, consumeErr
}

// scriptedConsumer answers ConsumeMetrics with the next scripted error (nil once the script is
// used up), keeps what it accepted, and signals every call on calls.
type scriptedConsumer struct {
	mu       sync.Mutex
	script   []error
	accepted []pmetric.Metrics
	calls    chan struct{}
}

func newScriptedConsumer(script ...error) *scriptedConsumer {
	return &scriptedConsumer{script: script, calls: make(chan struct{}, 64)}
}

func (c *scriptedConsumer) Capabilities() consumer.Capabilities { return consumer.Capabilities{} }

func (c *scriptedConsumer) ConsumeMetrics(_ context.Context, md pmetric.Metrics) error {
	c.mu.Lock()
	var err error
	if len(c.script) > 0 {
		err, c.script = c.script[0], c.script[1:]
	}
	if err == nil && md.ResourceMetrics().Len() > 0 {
		cp := pmetric.NewMetrics()
		md.CopyTo(cp)
		c.accepted = append(c.accepted, cp)
	}
	c.mu.Unlock()
	c.calls <- struct{}{}
	return err
}

// batchLabels returns the "batch" resource attribute of every resource accepted, in order.
func (c *scriptedConsumer) batchLabels() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, md := range c.accepted {
		for i := range md.ResourceMetrics().Len() {
			v, _ := md.ResourceMetrics().At(i).Resource().Attributes().Get("batch")
			out = append(out, v.AsString())
		}
	}
	return out
}

// waitCall waits for the next ConsumeMetrics call, failing the test after a generous bound.
func (c *scriptedConsumer) waitCall(t *testing.T) {
	t.Helper()
	select {
	case <-c.calls:
	case <-time.After(30 * time.Second):
		t.Fatal("the pipeline was not called within 30 s")
	}
}

// appendBatches appends batches labelled b1..bn with points data points each.
func appendBatches(fake *fakesidecar.Server, n, points int) {
	for i := range n {
		fake.Append(fakesidecar.Gauge(label(i+1), points))
	}
}

func label(i int) string { return "b" + strconv.Itoa(i) }

// sumDataPoints returns the values of an int64 sum from internal telemetry.
func sumDataPoints(t *testing.T, m metricdata.Metrics) []int64 {
	t.Helper()
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.Truef(t, ok, "%s is %T, not an int64 sum", m.Name, m.Data)
	out := make([]int64, 0, len(sum.DataPoints))
	for _, dp := range sum.DataPoints {
		out = append(out, dp.Value)
	}
	return out
}

// testPKI is a CA and a server certificate for 127.0.0.1/localhost, generated per test.
type testPKI struct {
	caFile string
	server tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gpumetrics test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	require.NoError(t, err)

	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	return testPKI{
		caFile: caFile,
		server: tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey},
	}
}

// serverOption returns the gRPC server option serving TLS with the test certificate.
func (p testPKI) serverOption() grpc.ServerOption {
	return grpc.Creds(credentials.NewServerTLSFromCert(&p.server))
}
