package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// nodeCallTimeout bounds one attempt of a node call at one registrar. A
// heartbeat tries the registrars in turn until one answers, and it must get
// through well inside the node's lease (the heartbeat interval is a third
// of it), so a registrar that stopped answering may cost only a short wait
// before the next one is asked, not the whole lease.
const nodeCallTimeout = 3 * time.Second

// AnnounceNode records the client's node (Config.Node) and starts or keeps
// its lease, and returns how often to call Heartbeat. An empty Name,
// Region or Cluster is the client's; other values are refused, since a
// client speaks for one node of one origin. The call goes to the registrar
// in use and, while that one cannot be reached, to each other one; it is
// not retried beyond that (see Permanent). node is not retained.
func (c *Client) AnnounceNode(ctx context.Context, node *registryv1.Node) (heartbeatInterval time.Duration, err error) {
	if node == nil {
		return 0, errors.New("client: announce node: node must be set")
	}
	n := proto.Clone(node).(*registryv1.Node)
	if n.Name == "" {
		n.Name = c.cfg.Node
	}
	if err := c.checkNode(n.Name); err != nil {
		return 0, fmt.Errorf("client: announce node: %w", err)
	}
	if err := c.origin().Claim(&n.Region, &n.Cluster, "node."); err != nil {
		return 0, fmt.Errorf("client: announce node: %w", err)
	}
	var resp *registrarv1.AnnounceNodeResponse
	err = c.nodeCall(ctx, "announcing", func(ctx context.Context, rpc registrarv1.RegistrarClient) (err error) {
		resp, err = rpc.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: n})
		return err
	})
	if err != nil {
		return 0, err
	}
	return time.Duration(resp.GetHeartbeatIntervalMs()) * time.Millisecond, nil
}

// Heartbeat renews the lease of the client's node, through the registrar
// in use or, while that one cannot be reached, any other. An error whose
// gRPC code is NotFound means the lease lapsed and the registrars presumed
// the node gone: announce it again and register its endpoints again.
func (c *Client) Heartbeat(ctx context.Context) error {
	if err := c.checkNode(c.cfg.Node); err != nil {
		return fmt.Errorf("client: heartbeat: %w", err)
	}
	return c.nodeCall(ctx, "renewing the lease of", func(ctx context.Context, rpc registrarv1.RegistrarClient) error {
		_, err := rpc.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: c.cfg.Node, Region: c.cfg.Region, Cluster: c.cfg.Cluster})
		return err
	})
}

// LeaveNode removes the client's node record and ends its lease, as
// Heartbeat chooses its registrar. A node the registrars do not know has
// left already: that is not an error.
func (c *Client) LeaveNode(ctx context.Context) error {
	if err := c.checkNode(c.cfg.Node); err != nil {
		return fmt.Errorf("client: leave node: %w", err)
	}
	err := c.nodeCall(ctx, "removing", func(ctx context.Context, rpc registrarv1.RegistrarClient) error {
		_, err := rpc.LeaveNode(ctx, &registrarv1.LeaveNodeRequest{Node: c.cfg.Node, Region: c.cfg.Region, Cluster: c.cfg.Cluster})
		return err
	})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	return err
}

// checkNode refuses node calls for a node other than the client's: its
// writes name Config.Node as their owner, so the node it keeps alive must
// be that one.
func (c *Client) checkNode(name string) error {
	if c.cfg.Node == "" {
		return &registry.FieldError{Field: "Config.Node", Reason: "must be set for node calls"}
	}
	if name != c.cfg.Node {
		return &registry.FieldError{Field: "node.name", Reason: fmt.Sprintf("%q is not this client's node %q (Config.Node)", name, c.cfg.Node)}
	}
	return nil
}

// nodeCall runs one node RPC on the client's connections (see
// eachRegistrar), naming the node and the registrar in its error.
func (c *Client) nodeCall(ctx context.Context, what string, call func(context.Context, registrarv1.RegistrarClient) error) error {
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	return c.eachRegistrar(ctx, nodeCallTimeout, func(ctx context.Context, idx int) error {
		if err := call(ctx, c.rpc[idx]); err != nil {
			return fmt.Errorf("client: %s node %s at %s: %w", what, c.cfg.Node, c.cfg.Addrs[idx], err)
		}
		return nil
	})
}
