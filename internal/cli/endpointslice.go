package cli

import (
	"github.com/spf13/pflag"

	"github.com/aethermesh/aether/kube/endpointslice"
	"github.com/aethermesh/aether/server"
)

// addEndpointSliceFlags adds the registrar's --endpointslices flags
// (server.EndpointSlicesConfig, package kube/endpointslice).
func addEndpointSliceFlags(f *pflag.FlagSet, opts *server.Config) {
	e := &opts.EndpointSlices
	f.BoolVar(&e.Enabled, "endpointslices", false, "also maintain discovery.k8s.io/v1 EndpointSlices of this cluster's services, so kube-proxy, CoreDNS and meshes see them (labelled endpointslice.kubernetes.io/managed-by="+endpointslice.ManagedBy+"; slices of other managers are never touched). Each service is published as the Kubernetes Service of the same name, which must be a DNS-1035 label (others are skipped and counted); create selector-less Services of those names for kube-proxy to route them")
	f.StringVar(&e.Namespace, "endpointslices-namespace", "", "with --endpointslices: the namespace the slices (and the writer's Lease) are in, the namespace of the selector-less Services they serve; empty takes the kubeconfig context's, or the pod's (POD_NAMESPACE, then its service account's), else default")
	f.StringVar(&e.Kubeconfig, "endpointslices-kubeconfig", "", "with --endpointslices: kubeconfig file of the cluster to write to (its current context); empty takes KUBECONFIG, else, in a pod, the pod's service account (~/.kube/config is not read unless named)")
	f.StringVar(&e.Region, "endpointslices-region", "", "with --endpointslices: publish the endpoints of this region (default --region)")
	f.StringVar(&e.Cluster, "endpointslices-cluster", "", "with --endpointslices: publish the endpoints of this cluster (default --cluster-name)")
	f.StringToStringVar(&e.ServiceNames, "endpointslices-service-name", nil, "with --endpointslices: publish an Aether service under another Kubernetes Service name, AETHER=KUBE (repeatable or comma-separated), e.g. payments.v2=payments-v2 for a name that is not a DNS-1035 label; a service whose own name is such a target is skipped, not merged")
	f.IntVar(&e.MaxEndpointsPerSlice, "endpointslices-max-endpoints", endpointslice.DefaultMaxEndpointsPerSlice, "with --endpointslices: most endpoints per slice (the EndpointSlice controller's default; the API server allows 1000)")
	f.BoolVar(&e.DisableZoneHints, "endpointslices-no-zone-hints", false, "with --endpointslices: leave out the zone hints (forZones: the endpoint's own zone, as for trafficDistribution PreferClose) of ready endpoints")
	f.BoolVar(&e.NoLeaderElection, "endpointslices-no-leader-election", false, "with --endpointslices: every registrar replica writes the slices, instead of the one holding the origin's coordination.k8s.io Lease (aether-endpointslices-<hash> in the slices' namespace)")
	f.Float64Var(&e.WriteQPS, "endpointslices-qps", endpointslice.DefaultWriteQPS, "with --endpointslices: most slice writes per second to the API server")
	f.IntVar(&e.WriteBurst, "endpointslices-burst", endpointslice.DefaultWriteBurst, "with --endpointslices: burst of slice writes above --endpointslices-qps")
	f.DurationVar(&e.Resync, "endpointslices-resync", endpointslice.DefaultResync, "with --endpointslices: list every managed slice and replan every service this often, repairing slices changed behind the registrar's back")
}

// endpointSliceZeroFlags are the --endpointslices flags whose zero would
// mean the default (see refuseZeros).
var endpointSliceZeroFlags = []string{
	"endpointslices-namespace", "endpointslices-kubeconfig", "endpointslices-region", "endpointslices-cluster",
	"endpointslices-max-endpoints", "endpointslices-qps", "endpointslices-burst", "endpointslices-resync",
}

// endpointSliceDefaults clears the flags' shown defaults when
// EndpointSlices are off: server.Config refuses --endpointslices-* options
// without --endpointslices, and a default is not an option given.
func endpointSliceDefaults(fs *pflag.FlagSet, opts *server.Config) {
	if opts.EndpointSlices.Enabled {
		return
	}
	e := &opts.EndpointSlices
	for name, clear := range map[string]func(){
		"endpointslices-max-endpoints": func() { e.MaxEndpointsPerSlice = 0 },
		"endpointslices-qps":           func() { e.WriteQPS = 0 },
		"endpointslices-burst":         func() { e.WriteBurst = 0 },
		"endpointslices-resync":        func() { e.Resync = 0 },
	} {
		if !fs.Changed(name) {
			clear()
		}
	}
}
