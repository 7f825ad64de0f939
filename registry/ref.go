package registry

import registryv1 "github.com/aethermesh/aether/api/registry/v1"

// Ref is id as the wire names an endpoint (EndpointRef). It is a plain copy,
// no normalization: a caller sends the identity it normalized, and the
// registrar normalizes what it receives as it does for the flat fields.
func (id EndpointID) Ref() *registryv1.EndpointRef {
	return &registryv1.EndpointRef{Service: id.Service, Protocol: id.Protocol, Ip: id.IP, Cluster: id.Cluster, Region: id.Region}
}

// IDOfRef returns the identity a reference names, without validating it
// (nil names the zero identity), as IDOf does for an endpoint.
func IDOfRef(r *registryv1.EndpointRef) EndpointID {
	return EndpointID{
		Region:   r.GetRegion(),
		Cluster:  r.GetCluster(),
		Service:  r.GetService(),
		Protocol: r.GetProtocol(),
		IP:       r.GetIp(),
	}
}
