package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/grpcapi"
)

// setupPeerWatch registers the RegistrarPeers service and tells the
// registrar the address to advertise and the TLS to dial its peers with
// (see registrar/peer.go).
func (s *Server) setupPeerWatch(api grpcapi.Config) error {
	opts := s.opts
	addr, err := peerAdvertiseAddr(opts.PeerAdvertiseAddr, s.grpcLis.Addr())
	if err != nil {
		return err
	}
	var clientTLS *tls.Config
	if opts.TLSEnabled() {
		ca := opts.PeerWatchCACert
		if ca == "" {
			ca = opts.TLSClientCAFile
		}
		if ca == "" {
			return errors.New("--peer-watch with --tls-cert needs a CA to verify peer registrars by: --peer-watch-cacert (or --tls-client-ca)")
		}
		// The registrar's own server certificate is its client identity
		// to its peers (pki server certificates allow client auth): with
		// mTLS on, only such server identities may open the stream.
		if clientTLS, err = pki.ClientTLSConfig(ca, opts.TLSCertFile, opts.TLSKeyFile); err != nil {
			return fmt.Errorf("--peer-watch-cacert/--tls-cert/--tls-key: %w", err)
		}
	}
	s.reg.SetPeerAddr(addr, clientTLS)
	return grpcapi.RegisterPeers(s.grpc, s.reg, api)
}

// peerAdvertiseAddr is the address peers dial: the flag's, or the bound
// one, with this host's name in place of an unspecified IP.
func peerAdvertiseAddr(flag string, bound net.Addr) (string, error) {
	if flag != "" {
		return flag, nil
	}
	host, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return "", fmt.Errorf("--peer-advertise-addr: cannot derive one from %s: %w", bound, err)
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("--peer-advertise-addr: --grpc-addr listens on every interface and the host name is unknown (%v); set it", err)
		}
	}
	return net.JoinHostPort(host, port), nil
}

// errNoMembers is the startup backend's answer when the connected backend
// keeps no member records; the registrar refuses to start peer-watch on it.
var errNoMembers = fmt.Errorf("--peer-watch: the configured backend keeps no member records (backend.Members): %w", errors.ErrUnsupported)

// PutMember and ListMembers pass peer-watch's membership to the backend
// once it is connected.
func (b *startupBackend) PutMember(ctx context.Context, region, cluster string, m backend.Member, lease int64) error {
	mb, ok := b.Backend.(backend.Members)
	if !ok {
		return errNoMembers
	}
	return mb.PutMember(ctx, region, cluster, m, lease)
}

func (b *startupBackend) ListMembers(ctx context.Context, region, cluster string) ([]backend.Member, error) {
	mb, ok := b.Backend.(backend.Members)
	if !ok {
		return nil, errNoMembers
	}
	return mb.ListMembers(ctx, region, cluster)
}

// DefaultWriteBatchInterval is --write-batch-interval's default for a
// backend: 10 ms on etcd without peer-watch, where a write reaches the
// other replicas only after the flush (cross-replica p99 was 146 ms at
// 100 ms and 58 ms at 10 ms at design scale; docs/benchmarks.md,
// "Peer-watch"); 100 ms otherwise: on etcd with peer-watch, whose
// replicas see each other's writes through it whatever the interval, and
// on every other store (DynamoDB, where each flush costs a revision write
// and billed item writes; one that rate-limits its writers).
func DefaultWriteBatchInterval(backend string, peerWatch bool) time.Duration {
	if (backend == "" || backend == BackendEtcd) && !peerWatch {
		return 10 * time.Millisecond
	}
	return registrar.DefaultOptions().WriteBatchInterval
}
