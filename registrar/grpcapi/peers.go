package grpcapi

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/authz"
)

// PeerSource is a replica's side of peer-watch: PeerWatch sends the
// replica's local writes, as it applies them, until ctx ends or send fails;
// its error ends the stream.
type PeerSource interface {
	PeerWatch(ctx context.Context, caller string, send func(*registrarv1.PeerWrites) error) error
}

// RulePeerIsServer is the authorization rule of the peer-watch stream:
// only another registrar (a server identity) may open it, since it carries
// every write of the cluster as it happens.
const RulePeerIsServer = "peer-is-server"

// RegisterPeers registers the RegistrarPeers service for src on srv. With
// cfg.Authz set, only server identities of its trust domain may open the
// stream; cfg.Registerer shares the Registrar service's denial counter.
func RegisterPeers(srv grpc.ServiceRegistrar, src PeerSource, cfg Config) error {
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &peerService{src: src}
	if cfg.Authz != nil {
		if p.g, err = newGuard(*cfg.Authz, m, log); err != nil {
			return err
		}
	}
	registrarv1.RegisterRegistrarPeersServer(srv, p)
	return nil
}

type peerService struct {
	registrarv1.UnimplementedRegistrarPeersServer
	src PeerSource
	g   *guard
}

func (p *peerService) PeerWatch(req *registrarv1.PeerWatchRequest, stream grpc.ServerStreamingServer[registrarv1.PeerWrites]) error {
	const method = "PeerWatch"
	ctx := stream.Context()
	if p.g != nil {
		id, err := p.g.identity(ctx, method)
		if err != nil {
			return err
		}
		if id.Kind != authz.Server {
			return p.g.denied(method, &authz.Error{
				Code: codes.PermissionDenied, Rule: RulePeerIsServer, Identity: id, Op: method,
				Msg: fmt.Sprintf("%s may not open the peer-watch stream: only registrar (server) identities may", id),
			})
		}
	}
	return p.src.PeerWatch(ctx, req.GetEpoch(), stream.Send)
}
