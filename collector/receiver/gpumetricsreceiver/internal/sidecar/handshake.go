// Package sidecar connects to a gpumetrics sidecar's MetricsPullService and LogsPullService,
// either by starting it as a HashiCorp go-plugin subprocess (StartPlugin) or by dialling a
// running one (DialRemote).
//
// The go-plugin handshake values are the ones in docs/architecture.md ("go-plugin handshake"),
// shared with the Python sidecar: cookie GPUMETRICS_PLUGIN_MAGIC_COOKIE, app protocol version 1,
// grpc only, broker multiplexing off, no AutoMTLS.
package sidecar

import (
	"context"
	"errors"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

const (
	// MagicCookieKey is the environment variable go-plugin sets in the sidecar's environment.
	MagicCookieKey = "GPUMETRICS_PLUGIN_MAGIC_COOKIE"
	// MagicCookieValue is its value. It is a UX check (the sidecar refuses to speak the plugin
	// protocol when started by hand), not a secret.
	MagicCookieValue = "50d8e6e2c9cf731147e4697d9b4853ee"
	// ProtocolVersion is the application protocol version both sides speak.
	ProtocolVersion = 1
	// PluginName is the name the pull client is dispensed under. It never crosses the wire.
	PluginName = "gpumetrics"
)

// Handshake is the go-plugin handshake configuration shared by host and plugin.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   MagicCookieKey,
	MagicCookieValue: MagicCookieValue,
}

// ErrNoServer is returned by PullPlugin.GRPCServer when the plugin has no implementation to
// serve; only a Go plugin (such as the receiver's test plugin) serves through this type.
var ErrNoServer = errors.New("sidecar: PullPlugin.Impl is nil; set it to serve MetricsPullService")

// PullPlugin is the go-plugin GRPCPlugin for gpumetrics.v1.MetricsPullService. The host dispenses
// a gpumetricsv1.MetricsPullServiceClient from it; a Go plugin serves Impl with it. net/rpc is not
// supported.
type PullPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the server implementation, set only on the plugin side.
	Impl gpumetricsv1.MetricsPullServiceServer
	// Logs, when set (plugin side), is served as gpumetrics.v1.LogsPullService too.
	Logs gpumetricsv1.LogsPullServiceServer
}

var _ plugin.GRPCPlugin = (*PullPlugin)(nil)

// GRPCServer registers Impl on s (plugin side). It returns ErrNoServer when Impl is nil.
func (p *PullPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return ErrNoServer
	}
	gpumetricsv1.RegisterMetricsPullServiceServer(s, p.Impl)
	if p.Logs != nil {
		gpumetricsv1.RegisterLogsPullServiceServer(s, p.Logs)
	}
	return nil
}

// GRPCClient returns a gpumetricsv1.MetricsPullServiceClient on conn (host side).
func (p *PullPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return gpumetricsv1.NewMetricsPullServiceClient(conn), nil
}
