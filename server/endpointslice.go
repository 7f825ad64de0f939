package server

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/aethermesh/aether/kube/endpointslice"
	"github.com/aethermesh/aether/registry"
)

// EndpointSlicesConfig configures the EndpointSlices the registrar
// maintains for Kubernetes-native consumers (package kube/endpointslice):
// opt-in, for the endpoints of one origin (this registrar's region and
// cluster unless Region/Cluster say another), each Aether service
// published as the Kubernetes Service of the same name in Namespace.
type EndpointSlicesConfig struct {
	Enabled bool
	// Namespace the slices are written to; empty takes the kubeconfig
	// context's namespace, or in a pod its service account's.
	Namespace string
	// Kubeconfig is the kubeconfig file; empty loads as client-go does
	// ($KUBECONFIG, ~/.kube/config, else the pod's service account).
	Kubeconfig string
	// Region and Cluster are the origin published; empty takes the
	// registrar's own.
	Region, Cluster string
	// ServiceNames publishes Aether services under other Kubernetes
	// Service names (aether name → Kubernetes name).
	ServiceNames map[string]string
	// MaxEndpointsPerSlice: 0 takes the EndpointSlice controller's 100.
	MaxEndpointsPerSlice int
	// DisableZoneHints leaves out the hints (forZones) every ready
	// endpoint with a zone otherwise carries.
	DisableZoneHints bool
	// NoLeaderElection lets every replica write the slices instead of
	// the one holding the origin's Lease (endpointslice.Election).
	NoLeaderElection bool
	// WriteQPS and WriteBurst bound the writes to the API server; Resync
	// is how often every managed slice is relisted and replanned. Zero
	// takes endpointslice's defaults.
	WriteQPS   float64
	WriteBurst int
	Resync     time.Duration
}

// endpointSlices is the reconciler a Server runs, and what it was built
// from.
type endpointSlices struct {
	rec *endpointslice.Reconciler
}

// validateEndpointSlices checks the --endpointslices* options.
func (c Config) validateEndpointSlices() error {
	e := c.EndpointSlices
	if !e.Enabled {
		if e.Namespace != "" || e.Kubeconfig != "" || e.Region != "" || e.Cluster != "" || len(e.ServiceNames) > 0 || e.MaxEndpointsPerSlice != 0 ||
			e.DisableZoneHints || e.NoLeaderElection || e.WriteQPS != 0 || e.WriteBurst != 0 || e.Resync != 0 {
			return fmt.Errorf("the --endpointslices-* flags configure EndpointSlices, which are off: add --endpointslices or drop them")
		}
		return nil
	}
	switch {
	case e.MaxEndpointsPerSlice < 0 || e.MaxEndpointsPerSlice > endpointslice.MaxMaxEndpointsPerSlice:
		return fmt.Errorf("--endpointslices-max-endpoints %d: want 1 to %d (the API server's limit; the EndpointSlice controller uses %d)", e.MaxEndpointsPerSlice, endpointslice.MaxMaxEndpointsPerSlice, endpointslice.DefaultMaxEndpointsPerSlice)
	case e.WriteQPS < 0:
		return fmt.Errorf("--endpointslices-qps must be positive")
	case e.WriteBurst < 0:
		return fmt.Errorf("--endpointslices-burst must be positive")
	case e.Resync < 0:
		return fmt.Errorf("--endpointslices-resync must be positive")
	case e.Resync > 0 && e.Resync < time.Second:
		return fmt.Errorf("--endpointslices-resync %s: want at least 1s (each resync lists every managed slice)", e.Resync)
	}
	if e.Namespace != "" {
		if errs := validation.IsDNS1123Label(e.Namespace); len(errs) > 0 {
			return fmt.Errorf("--endpointslices-namespace %q is not a Kubernetes namespace name: %s", e.Namespace, errs[0])
		}
	}
	targets := map[string]string{}
	for from, to := range e.ServiceNames {
		if err := registry.ValidateName("service", from); err != nil {
			return fmt.Errorf("--endpointslices-service-name %s=%s: %v", from, to, err)
		}
		if err := endpointslice.ServiceName(to); err != nil {
			return fmt.Errorf("--endpointslices-service-name %s=%s: %v", from, to, err)
		}
		if other, dup := targets[to]; dup {
			return fmt.Errorf("--endpointslices-service-name: %s and %s are both published as %s; give each its own Kubernetes name", other, from, to)
		}
		targets[to] = from
	}
	for flag, v := range map[string]string{"--endpointslices-region": e.Region, "--endpointslices-cluster": e.Cluster} {
		if v != "" {
			if err := registry.ValidateName(flag, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// setupEndpointSlices builds the reconciler when EndpointSlices are on:
// at launch, so that a bad kubeconfig fails the start at once. It starts
// once the registrar serves (startEndpointSlices).
func (s *Server) setupEndpointSlices() error {
	e := s.opts.EndpointSlices
	if !e.Enabled {
		return nil
	}
	// On --backend kubernetes the slices go to the same API server unless
	// --endpointslices-kubeconfig names another.
	if e.Kubeconfig == "" {
		e.Kubeconfig = s.opts.Kubeconfig
	}
	// The same rules as the backend's (kubeRESTConfig), so that one
	// kubeconfig serves both.
	restCfg, ns, _, err := kubeRESTConfig(e.Kubeconfig, e.Namespace, "--endpointslices", "--endpointslices-kubeconfig")
	if err != nil {
		return err
	}
	restCfg = rest.CopyConfig(restCfg)
	restCfg.UserAgent = "aether-registrar/endpointslices"
	// The reconciler's own token bucket paces the writes; client-go's
	// (5 QPS by default) is widened so it does not pace them again, and
	// lists have room.
	qps, burst := e.WriteQPS, e.WriteBurst
	if qps == 0 {
		qps = endpointslice.DefaultWriteQPS
	}
	if burst == 0 {
		burst = endpointslice.DefaultWriteBurst
	}
	restCfg.QPS, restCfg.Burst = float32(2*qps+5), 2*burst+10
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("--endpointslices-kubeconfig: %w", err)
	}
	region, cluster := e.Region, e.Cluster
	if region == "" {
		region = s.opts.Region
	}
	if cluster == "" {
		cluster = s.opts.ClusterName
	}
	var election *endpointslice.Election
	if !e.NoLeaderElection {
		election = &endpointslice.Election{}
	}
	rec, err := endpointslice.NewReconciler(endpointslice.ReconcilerConfig{
		Config: endpointslice.Config{
			Namespace:            ns,
			Region:               region,
			Cluster:              cluster,
			MaxEndpointsPerSlice: e.MaxEndpointsPerSlice,
			ZoneHints:            !e.DisableZoneHints,
		},
		ServiceNames: e.ServiceNames,
		Source:       s.reg,
		Client:       cs,
		WriteQPS:     qps,
		WriteBurst:   burst,
		Resync:       e.Resync,
		Election:     election,
		Logger:       s.opts.Logger.With("component", "endpointslices"),
		Registerer:   s.reg.MetricsRegistry(),
	})
	if err != nil {
		return fmt.Errorf("--endpointslices: %w", err)
	}
	s.eslices = &endpointSlices{rec: rec}
	s.opts.Logger.Info("EndpointSlices on", "host", restCfg.Host, "namespace", ns, "region", region, "cluster", cluster)
	return nil
}

// startEndpointSlices starts the reconciler, once the snapshot is loaded
// (its subscription would be refused before).
func (s *Server) startEndpointSlices() {
	if s.eslices != nil {
		s.eslices.rec.Start()
	}
}

// closeEndpointSlices stops the reconciler and joins its goroutines; the
// slices stay for a successor to adopt.
func (s *Server) closeEndpointSlices() {
	if s.eslices != nil {
		s.eslices.rec.Close()
		s.eslices = nil
	}
}
