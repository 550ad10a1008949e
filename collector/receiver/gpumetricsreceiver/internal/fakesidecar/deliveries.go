package fakesidecar

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// TrackDeliveries is the gRPC server option under which a Pull whose answer could not be sent
// (gRPC refused it as larger than the server's send limit, the call was cancelled or its
// connection broke before the answer went out) is taken back, as the sidecar does: its batches
// count as not sent and its drop report comes again with the next Pull. Serve the fake with it
// wherever that matters; without it an answer counts as delivered once the handler returned.
func TrackDeliveries() grpc.ServerOption { return grpc.StatsHandler(deliveryTracker{}) }

type deliveryKey struct{}

// pendingUndo holds what to take back if the call that carries it fails.
type pendingUndo struct {
	mu   sync.Mutex
	undo func()
}

// onFailedDelivery registers undo to run if the call of ctx ends with an error after its
// handler returned (only under TrackDeliveries).
func onFailedDelivery(ctx context.Context, undo func()) {
	if p, ok := ctx.Value(deliveryKey{}).(*pendingUndo); ok {
		p.mu.Lock()
		p.undo = undo
		p.mu.Unlock()
	}
}

// deliveryTracker is a stats.Handler: it gives each call a pendingUndo and runs it when the call
// ends in an error (stats.End.Error, which includes a response gRPC failed to send).
type deliveryTracker struct{}

func (deliveryTracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, deliveryKey{}, &pendingUndo{})
}

func (deliveryTracker) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok || end.Error == nil {
		return
	}
	if p, ok := ctx.Value(deliveryKey{}).(*pendingUndo); ok {
		p.mu.Lock()
		undo := p.undo
		p.undo = nil
		p.mu.Unlock()
		if undo != nil {
			undo()
		}
	}
}

func (deliveryTracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (deliveryTracker) HandleConn(context.Context, stats.ConnStats) {}
