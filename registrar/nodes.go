package registrar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// Node liveness. A node record is written synchronously (not write-behind)
// under an etcd lease of --node-ttl: the lease only means something once
// etcd holds it, and a node needs to know that its announcement stuck.
// Heartbeats may land on any replica; each renews the same lease, whose ID
// every replica learns from the record itself. When the heartbeats stop,
// etcd deletes the record; the ghost sweep then removes the node's
// endpoints. A registrar never declares a node dead on its own judgement.

// errBackend marks a failure to reach the backend; clients should retry.
var errBackend = replica.ErrBackendUnavailable

// errNoLeases refuses a node call on a store without leases
// (backend.Leases): node liveness here means records the store expires
// itself, so on such a store a node record could never lapse, and a
// retry cannot change that.
var errNoLeases = replica.ErrNoLeases

// AnnounceNode creates or refreshes a node record, keeping the node's lease
// if it is still alive.
func (r *Registrar) AnnounceNode(ctx context.Context, in *registryv1.Node) (*registryv1.Node, error) {
	if r.leases == nil {
		return nil, errNoLeases
	}
	if in != nil {
		region, cluster := in.GetRegion(), in.GetCluster()
		if err := r.claimOrigin(&region, &cluster, "node."); err != nil {
			return nil, err
		}
		if region != in.GetRegion() || cluster != in.GetCluster() {
			in = proto.Clone(in).(*registryv1.Node)
			in.Region, in.Cluster = region, cluster
		}
	}
	n, err := registry.NormalizeNode(in, r.opts.limits())
	if err != nil {
		return nil, err
	}
	id := registry.NodeIDOf(n)
	r.mu.Lock()
	prev := r.st.Node(id)
	// Node records are written synchronously, so etcd's order is their
	// acknowledgement order already; the stamp says so to readers.
	n.Stamp = r.st.NodeStamp(prev, r.now())
	r.mu.Unlock()

	n.LeaseTtlSeconds = int64(r.opts.NodeTTL / time.Second)
	n.AnnouncedAt = timestamppb.New(r.now())
	for attempt := 0; attempt < 2; attempt++ {
		lease := int64(0)
		if prev != nil && prev.LeaseId != 0 && attempt == 0 {
			if _, err := r.leases.KeepAliveOnce(ctx, prev.LeaseId); err == nil {
				lease = prev.LeaseId
				n.AnnouncedAt = prev.AnnouncedAt // same incarnation of the node
			} else if !errors.Is(err, backend.ErrLeaseNotFound) {
				return nil, fmt.Errorf("%w: renewing node %s's lease: %v", errBackend, id.Name, err)
			}
		}
		if lease == 0 {
			if lease, err = r.leases.GrantLease(ctx, r.opts.NodeTTL); err != nil {
				return nil, fmt.Errorf("%w: granting node %s a lease: %v", errBackend, id.Name, err)
			}
		}
		n.LeaseId = lease
		rev, err := r.leases.PutNode(ctx, n, lease)
		if errors.Is(err, backend.ErrLeaseNotFound) {
			continue // lapsed between the renewal and the put: start afresh
		}
		if err != nil {
			return nil, fmt.Errorf("%w: recording node %s: %v", errBackend, id.Name, err)
		}
		r.mu.Lock()
		r.st.NodePut(n, rev)
		r.mu.Unlock()
		if prev == nil || prev.LeaseId != lease {
			r.log.Info("node announced", "node", id.Name, "zone", n.Zone, "lease", fmt.Sprintf("%x", lease))
		}
		return n, nil
	}
	return nil, fmt.Errorf("%w: node %s's lease kept lapsing while announcing", errBackend, id.Name)
}

// nodeLease finds the lease of a node of this registrar's origin.
func (r *Registrar) nodeLease(name, region, cluster string) (registry.NodeID, int64, error) {
	if err := r.claimOrigin(&region, &cluster, ""); err != nil {
		return registry.NodeID{}, 0, err
	}
	id := registry.NodeID{Region: region, Cluster: cluster, Name: name}
	if err := registry.ValidateName("node", name); err != nil {
		return id, 0, &registry.FieldError{Field: "node", Reason: err.Error()}
	}
	r.mu.Lock()
	n := r.st.Node(id)
	r.mu.Unlock()
	if n == nil || n.LeaseId == 0 {
		return id, 0, fmt.Errorf("%w: node %q has no record (never announced, or its lease lapsed); announce it again", errNotFound, name)
	}
	return id, n.LeaseId, nil
}

// Heartbeat renews a node's lease.
func (r *Registrar) Heartbeat(ctx context.Context, name, region, cluster string) (time.Duration, error) {
	if r.leases == nil {
		return 0, errNoLeases
	}
	_, lease, err := r.nodeLease(name, region, cluster)
	if err != nil {
		return 0, err
	}
	ttl, err := r.leases.KeepAliveOnce(ctx, lease)
	switch {
	case errors.Is(err, backend.ErrLeaseNotFound):
		return 0, fmt.Errorf("%w: node %q's lease lapsed; announce it again", errNotFound, name)
	case err != nil:
		return 0, fmt.Errorf("%w: renewing node %q's lease: %v", errBackend, name, err)
	}
	return ttl, nil
}

// LeaveNode removes a node record at once by revoking its lease.
func (r *Registrar) LeaveNode(ctx context.Context, name, region, cluster string) error {
	if r.leases == nil {
		return errNoLeases
	}
	id, lease, err := r.nodeLease(name, region, cluster)
	if err != nil {
		return err
	}
	rev, err := r.leases.RevokeLease(ctx, lease)
	if err != nil {
		return fmt.Errorf("%w: revoking node %q's lease: %v", errBackend, name, err)
	}
	r.mu.Lock()
	r.act(r.st.NodeGone(id, rev))
	r.mu.Unlock()
	r.log.Info("node left", "node", name)
	return nil
}

// ListNodes returns the known node records with their lease state, and in
// each node's health what this registrar holds of the node's endpoints
// (endpoints_held, endpoints_held_serving), next to what the node claims:
// a node's own summary cannot show what a registrar lost.
func (r *Registrar) ListNodes(ctx context.Context) []*registrarv1.NodeStatus {
	r.mu.Lock()
	recs := r.st.Nodes()
	held := r.st.Held()
	r.mu.Unlock()
	out := make([]*registrarv1.NodeStatus, 0, len(recs))
	for _, n := range recs {
		// Stored records are shared and immutable; the counts go on a copy.
		n = proto.Clone(n).(*registryv1.Node)
		if n.Health == nil {
			n.Health = &registryv1.HealthSummary{}
		}
		h := held[registry.NodeIDOf(n)]
		n.Health.EndpointsHeld, n.Health.EndpointsHeldServing = h.Held, h.Serving
		out = append(out, &registrarv1.NodeStatus{Node: n, LastHeartbeatAgeSeconds: -1, LeaseRemainingSeconds: -1})
	}
	if r.leases == nil {
		return out // no lease to ask about
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, st := range out {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			remaining, granted, err := r.leases.LeaseTTL(ctx, st.Node.LeaseId)
			if err != nil {
				return
			}
			// A renewal resets the lease to its granted TTL, so what has
			// run off it since is the time since the last heartbeat.
			st.LeaseRemainingSeconds = remaining.Seconds()
			st.LastHeartbeatAgeSeconds = (granted - remaining).Seconds()
		}()
	}
	wg.Wait()
	return out
}

func (r *Registrar) kickSweep() {
	select {
	case r.sweepKick <- struct{}{}:
	default:
	}
}

// runSweep removes ghost endpoints of this registrar's own cluster: those
// whose node record is gone. It runs when a node record disappears and
// every third of --node-ttl (core.SweepEvery) as a backstop. On a store
// without leases it does nothing: there are no node records, so every
// endpoint with a node would look like a ghost, though no node's liveness
// was ever judged.
func (r *Registrar) runSweep(ctx context.Context) {
	if r.leases == nil {
		return
	}
	t := r.clock.NewTicker(core.SweepEvery(r.opts.NodeTTL))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-r.sweepKick:
		}
		r.sweep()
	}
}

// sweep removes the current ghosts (core.State.SweepStep). It looks at a
// few services per hold of the lock (core.SweepChunk, about listingStep
// endpoints), so the walk never holds back writes and watch events for
// long on a large registry.
func (r *Registrar) sweep() int {
	r.mu.Lock()
	services := r.st.Services()
	r.mu.Unlock()
	swept, full := 0, false
	for len(services) > 0 && !full {
		r.mu.Lock()
		n := core.SweepChunk(services, r.st.ServiceSize, listingStep)
		eff, gone, deferred, err := r.st.SweepStep(services[:n], r.opts.Region, r.opts.ClusterName, r.now(), r.opts.NodeTTL)
		services = services[n:]
		for _, g := range gone {
			r.log.Info("swept endpoint of a node whose lease lapsed", "endpoint", g.ID.String(), "node", g.Node)
		}
		if err != nil {
			// The queue is full: the sweep tries again next round.
			r.log.Warn("ghost sweep deferred", "endpoint", deferred.String(), "err", err)
			full = true
		}
		r.act(eff)
		r.mu.Unlock()
		swept += len(gone)
	}
	if swept > 0 {
		r.metrics.swept.Add(float64(swept))
	}
	return swept
}
