package deploy_test

import (
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The registrar's ports, as seed 001's Deployment has them (gRPC 9443,
// health 8081) and xDS on 15010; the Service, the container ports and the
// listen flags must agree.
var registrarPorts = map[string]int32{"grpc": 9443, "http": 8081, "xds": 15010}

var registrarListenFlag = map[string]string{"grpc": "grpc-addr", "http": "http-addr", "xds": "xds-addr"}

// argValue returns the value of --name=value in args, or "".
func argValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// checkPodHardening is the pod and container hardening every workload
// here has: non-root, no privilege escalation, no capabilities, a
// read-only root, the runtime's seccomp profile, requests and limits.
func checkPodHardening(pod *corev1.PodTemplateSpec, claims ...string) []string {
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	psc := pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		bad("pod: securityContext.runAsNonRoot is not true")
	}
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		bad("pod: securityContext.runAsUser is unset or 0")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		bad("pod: seccompProfile is not RuntimeDefault")
	}
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		bad("pod: uses a host namespace")
	}
	for _, c := range pod.Spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			bad("container %s: readOnlyRootFilesystem is not true", c.Name)
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			bad("container %s: allowPrivilegeEscalation is not false", c.Name)
		}
		if sc == nil || sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			bad("container %s: capabilities are not drop [ALL], add none", c.Name)
		}
		if sc != nil && sc.Privileged != nil && *sc.Privileged {
			bad("container %s: privileged", c.Name)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				bad("container %s: no %s request", c.Name, r)
			}
			if _, ok := c.Resources.Limits[r]; !ok {
				bad("container %s: no %s limit", c.Name, r)
			}
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				bad("container %s: hostPort %d", c.Name, p.HostPort)
			}
		}
		vols := map[string]bool{}
		for _, cl := range claims {
			vols[cl] = true
		}
		for _, v := range pod.Spec.Volumes {
			vols[v.Name] = true
			if v.HostPath != nil {
				bad("volume %s: hostPath", v.Name)
			}
		}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				bad("container %s: mounts volume %s, which the pod does not have", c.Name, m.Name)
			}
		}
	}
	return probs
}

// mountedFile reports whether path lies under a volume mount of c whose
// volume is a Secret (TLS material) or a PersistentVolumeClaim template.
func mountedFrom(pod *corev1.PodTemplateSpec, c *corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name {
				switch {
				case v.Secret != nil:
					return "secret"
				case v.EmptyDir != nil:
					return "emptyDir"
				}
			}
		}
		return "claim:" + m.Name // not a pod volume: a StatefulSet claim (checked by the caller)
	}
	return ""
}

// checkRegistrar checks a rendered kustomization's registrar: its
// workload, probes, ports, Service, disruption budget, spreading, backend
// settings and TLS files. Every problem is returned.
func checkRegistrar(t *testing.T, p *parts) []string {
	t.Helper()
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	var regs []workload
	for _, w := range p.workloads() {
		if w.name == "aether-registrar" {
			regs = append(regs, w)
		}
	}
	if len(regs) != 1 {
		bad("want one registrar workload, got %d", len(regs))
		return probs
	}
	w := regs[0]
	pod := w.pod
	var claims []string
	for _, st := range p.statefulsets {
		for _, vc := range st.Spec.VolumeClaimTemplates {
			claims = append(claims, vc.Name)
		}
	}
	probs = append(probs, checkPodHardening(pod, claims...)...)
	if len(pod.Spec.Containers) != 1 {
		bad("registrar pod: want one container, got %d", len(pod.Spec.Containers))
		return probs
	}
	c := &pod.Spec.Containers[0]
	env, err := p.env(c)
	if err != nil {
		bad("%v", err)
		return probs
	}
	backend := env["AETHER_BACKEND"].value
	if backend == "" {
		backend = "etcd"
	}
	embedded := backend == "etcd" && env["AETHER_ETCD_ENDPOINTS"].value == ""
	switch {
	case w.kind == "Deployment" && embedded:
		bad("Deployment on the embedded etcd: each replica would have a store of its own; set AETHER_ETCD_ENDPOINTS or use the embedded-etcd StatefulSet")
	case w.kind == "Deployment" && w.replicas != 2:
		bad("Deployment replicas = %d, want 2", w.replicas)
	case w.kind == "StatefulSet" && !embedded:
		bad("StatefulSet without the embedded etcd")
	case w.kind == "StatefulSet" && w.replicas != 1:
		bad("StatefulSet replicas = %d: the embedded etcd is a single member, want 1", w.replicas)
	}
	if embedded {
		dir := env["AETHER_DATA_DIR"].value
		st := p.statefulsets
		where := mountedFrom(pod, c, dir+"/x")
		claim := false
		if len(st) == 1 && strings.HasPrefix(where, "claim:") {
			for _, vc := range st[0].Spec.VolumeClaimTemplates {
				claim = claim || "claim:"+vc.Name == where
			}
		}
		if !claim {
			bad("embedded etcd's --data-dir %q is not on a PersistentVolumeClaim (mounted from %q)", dir, where)
		}
	}

	// Ports: container ports, listen flags and the Service agree with the seed.
	cports := map[string]int32{}
	for _, cp := range c.Ports {
		cports[cp.Name] = cp.ContainerPort
	}
	for name, port := range registrarPorts {
		if cports[name] != port {
			bad("container port %s = %d, want %d", name, cports[name], port)
		}
		addr, ok := argValue(c.Args, registrarListenFlag[name])
		if !ok {
			bad("no --%s: without TLS the registrar would listen on loopback only, out of the Service's reach", registrarListenFlag[name])
			continue
		}
		host, ps, err := net.SplitHostPort(addr)
		if err != nil || host != "" || ps != strconv.Itoa(int(port)) {
			bad("--%s=%s: want :%d (every interface, the container port)", registrarListenFlag[name], addr, port)
		}
	}
	var svc *corev1.Service
	for _, s := range p.services {
		if s.Name == "aether-registrar" {
			svc = s
		}
	}
	if svc == nil {
		bad("no Service aether-registrar")
	} else {
		if !selects(svc.Spec.Selector, pod.Labels) {
			bad("Service selector %v does not select the registrar pods (%v)", svc.Spec.Selector, pod.Labels)
		}
		seen := map[string]bool{}
		for _, sp := range svc.Spec.Ports {
			seen[sp.Name] = true
			if want, ok := registrarPorts[sp.Name]; !ok || sp.Port != want || sp.TargetPort != intstr.FromString(sp.Name) {
				bad("Service port %s: %d -> %s, want %d -> the container's %s", sp.Name, sp.Port, sp.TargetPort.String(), want, sp.Name)
			}
		}
		for name := range registrarPorts {
			if !seen[name] {
				bad("Service has no %s port", name)
			}
		}
	}

	// Probes on the HTTP port: readiness /readyz, liveness /healthz, HTTPS
	// when the registrar serves TLS.
	_, tls := argValue(c.Args, "tls-cert")
	wantScheme := corev1.URISchemeHTTP
	if tls {
		wantScheme = corev1.URISchemeHTTPS
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			bad("no %s probe (httpGet)", pr.name)
			continue
		}
		g := pr.probe.HTTPGet
		scheme := g.Scheme
		if scheme == "" {
			scheme = corev1.URISchemeHTTP
		}
		if g.Path != pr.path || g.Port != intstr.FromString("http") || scheme != wantScheme {
			bad("%s probe %s %s on port %s, want %s %s on port http", pr.name, scheme, g.Path, g.Port.String(), wantScheme, pr.path)
		}
	}

	// Disruption budget and spreading for the replicated Deployment.
	if w.kind == "Deployment" {
		var pdbOK bool
		for _, b := range p.pdbs {
			if b.Spec.Selector != nil && selects(b.Spec.Selector.MatchLabels, pod.Labels) &&
				(b.Spec.MaxUnavailable != nil && b.Spec.MaxUnavailable.IntValue() == 1 || b.Spec.MinAvailable != nil && b.Spec.MinAvailable.IntValue() == 1) {
				pdbOK = true
			}
		}
		if !pdbOK {
			bad("no PodDisruptionBudget keeping one registrar replica up")
		}
		zone := false
		for _, tsc := range pod.Spec.TopologySpreadConstraints {
			zone = zone || tsc.TopologyKey == "topology.kubernetes.io/zone" && tsc.LabelSelector != nil && selects(tsc.LabelSelector.MatchLabels, pod.Labels)
		}
		if !zone {
			bad("no topologySpreadConstraint over topology.kubernetes.io/zone")
		}
	}

	// Every TLS file flag points into a mounted Secret.
	for _, f := range []string{"tls-cert", "tls-key", "tls-client-ca", "etcd-cacert", "etcd-cert", "etcd-key", "peer-etcd-cacert", "peer-etcd-cert", "peer-etcd-key"} {
		if v, ok := argValue(c.Args, f); ok && mountedFrom(pod, c, v) != "secret" {
			bad("--%s=%s is not in a mounted Secret", f, v)
		}
	}
	if adv := env["AETHER_PEER_ADVERTISE_ADDR"]; adv.value != "" {
		ip := env["POD_IP"]
		want := "$(POD_IP):" + strconv.Itoa(int(registrarPorts["grpc"]))
		if adv.value != want || ip.from == nil || ip.from.FieldRef == nil || ip.from.FieldRef.FieldPath != "status.podIP" {
			bad("peer-watch advertises %q (POD_IP from %+v), want %s with POD_IP the pod's status.podIP", adv.value, ip.from, want)
		}
		// The kubelet expands $(VAR) only from variables defined before.
		pos := map[string]int{}
		for i, e := range c.Env {
			pos[e.Name] = i
		}
		if pi, ok := pos["POD_IP"]; !ok || pi > pos["AETHER_PEER_ADVERTISE_ADDR"] {
			bad("POD_IP is not defined before AETHER_PEER_ADVERTISE_ADDR: $(POD_IP) would stay literal")
		}
	}
	if _, ok := argValue(c.Args, "tls-client-ca"); ok && env["AETHER_TRUST_DOMAIN"].value == "" {
		bad("--tls-client-ca without AETHER_TRUST_DOMAIN: the registrar refuses to start")
	}

	// The API credential is mounted only where something uses it.
	_, slices := env["AETHER_ENDPOINTSLICES"]
	needsAPI := backend == "kubernetes" || slices && env["AETHER_ENDPOINTSLICES"].value == "true"
	mounted := deref(pod.Spec.AutomountServiceAccountToken, true)
	for _, sa := range p.sas {
		if sa.Name == pod.Spec.ServiceAccountName {
			mounted = mounted && deref(sa.AutomountServiceAccountToken, true)
		}
	}
	if mounted != needsAPI {
		bad("ServiceAccount token mounted = %v, but the registrar talks to the API server = %v", mounted, needsAPI)
	}
	return probs
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkAgent checks the agent DaemonSet: hardening, node identity from the
// downward API, its registrars the registrar Service's gRPC port.
func checkAgent(p *parts) []string {
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if len(p.daemonsets) != 1 {
		bad("want one agent DaemonSet, got %d", len(p.daemonsets))
		return probs
	}
	pod := &p.daemonsets[0].Spec.Template
	probs = append(probs, checkPodHardening(pod)...)
	c := &pod.Spec.Containers[0]
	env, err := p.env(c)
	if err != nil {
		return append(probs, err.Error())
	}
	if n := env["AETHER_NODE"]; n.from == nil || n.from.FieldRef == nil || n.from.FieldRef.FieldPath != "spec.nodeName" {
		bad("AETHER_NODE is not the pod's spec.nodeName")
	}
	reg := env["AETHER_REGISTRAR"].value
	if reg != "aether-registrar.aether-system.svc:"+strconv.Itoa(int(registrarPorts["grpc"])) {
		bad("AETHER_REGISTRAR=%q, want the registrar Service's gRPC port", reg)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		bad("agent has no /healthz liveness probe")
	} else if addr, _ := argValue(c.Args, "http-addr"); !strings.HasSuffix(addr, ":"+c.LivenessProbe.HTTPGet.Port.String()) && c.LivenessProbe.HTTPGet.Port.String() != "http" {
		bad("agent probe port %s is not its --http-addr %s", c.LivenessProbe.HTTPGet.Port.String(), addr)
	}
	return probs
}

// clusterKinds are the kinds here that have no namespace.
var clusterKinds = map[string]bool{"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true}

// checkNamespaces: every namespaced object names the namespace the
// manifests create (one without lands in kubectl's current namespace).
func checkNamespaces(r *rendered) []string {
	var probs []string
	ns := ""
	for _, o := range r.objs {
		if o.GetKind() == "Namespace" {
			ns = o.GetName()
		}
	}
	if ns == "" {
		return []string{"no Namespace object"}
	}
	for _, o := range r.objs {
		if clusterKinds[o.GetKind()] {
			continue
		}
		if o.GetNamespace() != ns {
			probs = append(probs, fmt.Sprintf("%s %s is in namespace %q, not %s", o.GetKind(), o.GetName(), o.GetNamespace(), ns))
		}
	}
	return probs
}

func TestManifestsShape(t *testing.T) {
	for _, r := range everything(t) {
		if probs := checkNamespaces(r); len(probs) > 0 {
			t.Errorf("%s: namespaces:\n  %s", r.dir, strings.Join(probs, "\n  "))
		}
		p := typedParts(t, r)
		if probs := checkRegistrar(t, p); len(probs) > 0 {
			t.Errorf("%s: registrar:\n  %s", r.dir, strings.Join(probs, "\n  "))
		}
		if len(p.daemonsets) > 0 {
			if probs := checkAgent(p); len(probs) > 0 {
				t.Errorf("%s: agent:\n  %s", r.dir, strings.Join(probs, "\n  "))
			}
		}
	}
}

// Each check must be able to fail: break the etcd overlay in one way at a
// time and expect that way to be named.
func TestManifestsShapeCatchesBreakage(t *testing.T) {
	cases := []struct {
		name string
		dir  string
		edit func(p *parts)
		want string
	}{
		{"root", "overlays/etcd", func(p *parts) { var u int64; p.deployments[0].Spec.Template.Spec.SecurityContext.RunAsUser = &u }, "runAsUser is unset or 0"},
		{"writable root", "overlays/etcd", func(p *parts) {
			f := false
			p.deployments[0].Spec.Template.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = &f
		}, "readOnlyRootFilesystem"},
		{"liveness on readyz", "overlays/etcd", func(p *parts) {
			p.deployments[0].Spec.Template.Spec.Containers[0].LivenessProbe.HTTPGet.Path = "/readyz"
		}, "liveness probe"},
		{"one replica", "overlays/etcd", func(p *parts) { one := int32(1); p.deployments[0].Spec.Replicas = &one }, "replicas = 1"},
		{"no pdb", "overlays/etcd", func(p *parts) { p.pdbs = nil }, "PodDisruptionBudget"},
		{"no zone spread", "overlays/etcd", func(p *parts) { p.deployments[0].Spec.Template.Spec.TopologySpreadConstraints = nil }, "topology.kubernetes.io/zone"},
		{"loopback grpc", "overlays/etcd", func(p *parts) {
			c := &p.deployments[0].Spec.Template.Spec.Containers[0]
			c.Args[1] = "--grpc-addr=127.0.0.1:9443"
		}, "--grpc-addr=127.0.0.1:9443"},
		{"service port", "overlays/etcd", func(p *parts) {
			for _, s := range p.services {
				if s.Name == "aether-registrar" {
					s.Spec.Ports[0].Port = 443
				}
			}
		}, "Service port grpc"},
		{"token on etcd", "overlays/etcd", func(p *parts) {
			tr := true
			p.sas[0].AutomountServiceAccountToken = &tr
			p.deployments[0].Spec.Template.Spec.AutomountServiceAccountToken = &tr
		}, "token mounted = true"},
		{"deployment on embedded etcd", "overlays/etcd", func(p *parts) {
			for _, c := range p.configmaps {
				delete(c.Data, "AETHER_ETCD_ENDPOINTS")
			}
		}, "embedded etcd"},
		{"data dir off the volume", "overlays/embedded-etcd", func(p *parts) {
			for _, c := range p.configmaps {
				if _, ok := c.Data["AETHER_DATA_DIR"]; ok {
					c.Data["AETHER_DATA_DIR"] = "/tmp/data"
				}
			}
		}, "not on a PersistentVolumeClaim"},
		{"http probe on tls", "overlays/multi-region", func(p *parts) {
			p.deployments[0].Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Scheme = ""
		}, "readiness probe HTTP"},
		{"tls file unmounted", "overlays/multi-region", func(p *parts) {
			c := &p.deployments[0].Spec.Template.Spec.Containers[0]
			for i, a := range c.Args {
				if strings.HasPrefix(a, "--tls-cert=") {
					c.Args[i] = "--tls-cert=/etc/tls.crt"
				}
			}
		}, "--tls-cert=/etc/tls.crt is not in a mounted Secret"},
		{"agent node name", "overlays/etcd", func(p *parts) {
			c := &p.daemonsets[0].Spec.Template.Spec.Containers[0]
			for i := range c.Env {
				if c.Env[i].Name == "AETHER_NODE" {
					c.Env[i].ValueFrom.FieldRef.FieldPath = "metadata.name"
				}
			}
		}, "AETHER_NODE"},
		{"peer address before POD_IP", "combo:etcd-peer-watch", func(p *parts) {
			c := &p.deployments[0].Spec.Template.Spec.Containers[0]
			var ip, rest []corev1.EnvVar
			for _, e := range c.Env {
				if e.Name == "POD_IP" {
					ip = append(ip, e)
				} else {
					rest = append(rest, e)
				}
			}
			c.Env = append(rest, ip...)
		}, "would stay literal"},
		{"agent hostPort", "overlays/etcd", func(p *parts) { p.daemonsets[0].Spec.Template.Spec.Containers[0].Ports[0].HostPort = 15010 }, "hostPort"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r *rendered
			if name, ok := strings.CutPrefix(c.dir, "combo:"); ok {
				r = renderCombo(t, name)
			} else {
				r = render(t, c.dir)
			}
			p := typedParts(t, r)
			if probs := append(checkRegistrar(t, p), checkAgent(p)...); len(probs) > 0 {
				t.Fatalf("unbroken %s already fails: %v", c.dir, probs)
			}
			c.edit(p)
			probs := append(checkRegistrar(t, p), checkAgent(p)...)
			for _, pr := range probs {
				if strings.Contains(pr, c.want) {
					return
				}
			}
			t.Fatalf("want a problem containing %q, got %q", c.want, probs)
		})
	}
}

func TestNamespaceCheckCatchesAStrayObject(t *testing.T) {
	r := render(t, "overlays/kubernetes")
	if probs := checkNamespaces(r); len(probs) > 0 {
		t.Fatalf("unbroken: %v", probs)
	}
	for _, o := range r.objs {
		if o.GetKind() == "Role" {
			o.SetNamespace("")
		}
	}
	if probs := checkNamespaces(r); len(probs) != 1 || !strings.Contains(probs[0], `Role aether-registrar is in namespace ""`) {
		t.Fatalf("a Role without a namespace: got %q", probs)
	}
}

// The embedded-etcd StatefulSet's container is the base Deployment's but
// for the data volume, so a change to one that misses the other shows.
func TestStatefulSetMatchesDeployment(t *testing.T) {
	dep := typedParts(t, render(t, "overlays/etcd")).deployments[0].Spec.Template.Spec
	sts := typedParts(t, render(t, "overlays/embedded-etcd")).statefulsets[0].Spec.Template.Spec
	dc, sc := dep.Containers[0].DeepCopy(), sts.Containers[0].DeepCopy()
	var mounts []corev1.VolumeMount
	for _, m := range sc.VolumeMounts {
		if m.Name != "data" {
			mounts = append(mounts, m)
		}
	}
	sc.VolumeMounts = mounts
	dc.EnvFrom, sc.EnvFrom = nil, nil // the settings differ by design
	if !reflect.DeepEqual(dc, sc) {
		t.Errorf("the StatefulSet's registrar container differs from the Deployment's beyond the data volume:\ndeployment:  %+v\nstatefulset: %+v", dc, sc)
	}
	dep.Containers, sts.Containers = nil, nil
	dep.TopologySpreadConstraints, dep.Affinity = nil, nil // spreading one replica means nothing
	sts.SecurityContext.FSGroupChangePolicy = nil
	if !reflect.DeepEqual(dep, sts) {
		t.Errorf("the StatefulSet's pod differs from the Deployment's:\ndeployment:  %+v\nstatefulset: %+v", dep, sts)
	}
}
