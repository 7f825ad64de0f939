package cli

import (
	"strings"
	"testing"
	"time"
)

// TestEndpointSliceFlags: the flags reach server.Config; without
// --endpointslices the others are refused, as are zeros and bad values,
// each naming the flag.
func TestEndpointSliceFlags(t *testing.T) {
	base := []string{"registrar", "--cluster-name", "c1", "--region", "r1"}

	res := runCLI(t, nil, nil, base...)
	if res.err != nil || res.served == nil || res.served.EndpointSlices.Enabled || res.served.EndpointSlices.MaxEndpointsPerSlice != 0 {
		t.Fatalf("off by default: %v %+v", res.err, res.served)
	}

	res = runCLI(t, nil, nil, append(base, "--endpointslices", "--endpointslices-namespace", "mesh",
		"--endpointslices-kubeconfig", "/k/config", "--endpointslices-max-endpoints", "50",
		"--endpointslices-no-zone-hints", "--endpointslices-cluster", "c2",
		"--endpointslices-service-name", "pay.v2=pay-v2", "--endpointslices-service-name", "Web=web")...)
	if res.err != nil || res.served == nil {
		t.Fatalf("--endpointslices: %v", res.err)
	}
	e := res.served.EndpointSlices
	if !e.Enabled || e.Namespace != "mesh" || e.Kubeconfig != "/k/config" || e.MaxEndpointsPerSlice != 50 ||
		!e.DisableZoneHints || e.Cluster != "c2" || len(e.ServiceNames) != 2 || e.ServiceNames["pay.v2"] != "pay-v2" || e.Region != "" || e.WriteQPS != 20 || e.Resync != 5*time.Minute {
		t.Fatalf("served %+v", e)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--endpointslices-namespace", "mesh"}, "add --endpointslices"},
		{[]string{"--endpointslices", "--endpointslices-max-endpoints", "0"}, "--endpointslices-max-endpoints 0"},
		{[]string{"--endpointslices", "--endpointslices-max-endpoints", "1001"}, "--endpointslices-max-endpoints 1001"},
		{[]string{"--endpointslices", "--endpointslices-namespace", "Mesh_1"}, "--endpointslices-namespace"},
		{[]string{"--endpointslices", "--endpointslices-resync", "10ms"}, "--endpointslices-resync"},
		{[]string{"--endpointslices", "--endpointslices-cluster", "a/b"}, "--endpointslices-cluster"},
		{[]string{"--endpointslices", "--endpointslices-service-name", "a=B_1"}, "--endpointslices-service-name a=B_1"},
		{[]string{"--endpointslices", "--endpointslices-service-name", "a=x,b=x"}, "both published as x"},
		{[]string{"--endpointslices", "--endpointslices-service-name", "a"}, "--endpointslices-service-name"},
	} {
		res := runCLI(t, nil, nil, append(base, tc.args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) || res.served != nil {
			t.Errorf("%v: %v, want an error naming %q", tc.args, res.err, tc.want)
		}
	}
}
