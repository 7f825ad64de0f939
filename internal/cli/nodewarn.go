package cli

import (
	"context"
	"fmt"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// nodeWarning checks, after an endpoint bound to a node was registered,
// that the node has a live record, and returns what to tell the user if
// not ("" when all is well). The registrar accepts such an endpoint (an
// agent announcing the node a moment later is the normal start-up order),
// but its ghost sweep removes endpoints whose node has no record once
// --node-ttl has passed: without an agent for the node, the endpoint
// silently disappears half a minute later. The registration stands either
// way; this only says what will happen to it.
func nodeWarning(ctx context.Context, c registrarv1.RegistrarClient, ep *registryv1.ServiceEndpoint) string {
	node := ep.GetNode()
	if node == "" {
		return ""
	}
	resp, err := c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
	if err != nil {
		return fmt.Sprintf("warning: could not check that node %s has a live record (%v); an endpoint with --node is removed by the registrar's ghost sweep when its node has none", node, err)
	}
	for _, st := range resp.GetNodes() {
		n := st.GetNode()
		if n.GetName() == node && n.GetCluster() == ep.GetCluster() && n.GetRegion() == ep.GetRegion() {
			return ""
		}
	}
	return fmt.Sprintf("warning: node %s has no live record (no `aether agent --node %s` is running against this registrar's cluster); "+
		"this endpoint will be removed by the registrar's ghost sweep after its --node-ttl (default 30s) unless the node announces itself; "+
		"register without --node for a static endpoint", node, node)
}
