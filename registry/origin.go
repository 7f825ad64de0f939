package registry

import "fmt"

// Origin is the region and cluster a writer (a registrar, the client
// library) writes for. It is what an empty region or cluster in a request
// stands for, and the only origin the writer accepts: a registrar stores
// and lease-owns only its own origin's keys, and the client's cache files
// an endpoint under the origin its registrars will give it.
type Origin struct {
	Region, Cluster string
	// Refusal words the refusal of a requested region or cluster that is
	// not the writer's: part is "region" or "cluster", got the requested
	// value and own the writer's. Each writer says in it how to write
	// that origin instead; nil gives a plain "is not this writer's".
	Refusal func(part, got, own string) string
}

// Claim fills an empty *region or *cluster with o's, then refuses any other
// than o's with a FieldError named field+"region" or field+"cluster" (field
// is the request's path to them, e.g. "endpoint." or "").
func (o Origin) Claim(region, cluster *string, field string) error {
	if *region == "" {
		*region = o.Region
	}
	if *cluster == "" {
		*cluster = o.Cluster
	}
	if *region != o.Region {
		return &FieldError{Field: field + "region", Reason: o.refusal("region", *region, o.Region)}
	}
	if *cluster != o.Cluster {
		return &FieldError{Field: field + "cluster", Reason: o.refusal("cluster", *cluster, o.Cluster)}
	}
	return nil
}

func (o Origin) refusal(part, got, own string) string {
	if o.Refusal != nil {
		return o.Refusal(part, got, own)
	}
	return fmt.Sprintf("%q is not this writer's %s %q", got, part, own)
}

// NormalizeID checks the identity of an endpoint named in a request (an
// unregister, a drain) and returns it as it is keyed: origin claimed (see
// Claim), IP in canonical form. Every failure is a FieldError named after
// the part: "region", "cluster", "service", "protocol" or "ip". The origin
// is claimed first, so a request for another origin is told where to write
// rather than what else is wrong with it; the origin's names are checked
// last, since after the claim they are o's own and fail only if o does.
func (o Origin) NormalizeID(id EndpointID) (EndpointID, error) {
	if err := o.Claim(&id.Region, &id.Cluster, ""); err != nil {
		return id, err
	}
	return checkID(id, "")
}

// checkID checks every part of an identity from a request and returns it
// with its IP in canonical form. A failure is a FieldError named field plus
// the part. The endpoint's own parts (service, protocol, ip) go before its
// origin's; NormalizeEndpoint and NormalizeID both check through here, so
// an endpoint and a bare identity with the same fault are refused with the
// same words.
func checkID(id EndpointID, field string) (EndpointID, error) {
	if err := ValidateName("service", id.Service); err != nil {
		return id, fieldErr(field+"service", err)
	}
	if _, err := ProtocolSegment(id.Protocol); err != nil {
		return id, fieldErr(field+"protocol", err)
	}
	ip, err := CanonicalIP(id.IP)
	if err != nil {
		return id, fieldErr(field+"ip", err)
	}
	id.IP = ip
	if err := ValidateName("region", id.Region); err != nil {
		return id, fieldErr(field+"region", err)
	}
	if err := ValidateName("cluster", id.Cluster); err != nil {
		return id, fieldErr(field+"cluster", err)
	}
	return id, nil
}
