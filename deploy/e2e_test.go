package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/kube/endpointslice"
)

// podCommand is a container's command line and environment as the kubelet
// would run it from the manifests, outside a pod: ConfigMap and env values
// resolved (the downward API from pod, the memory limit), listen addresses
// moved to free loopback ports (listen maps a flag to its new address;
// a listen flag not in it gets a free port), set overriding variables
// (a registrar address, say), and KUBECONFIG standing in for the token
// the kubelet would mount.
func podCommand(t *testing.T, p *parts, c *corev1.Container, pod downward, listen, set map[string]string, kubeconfig string) (args, env []string) {
	t.Helper()
	vars, err := p.env(c)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range vars {
		val := v.value
		switch {
		case v.from == nil:
		case v.from.FieldRef != nil && v.from.FieldRef.FieldPath == "metadata.namespace":
			val = pod.namespace
		case v.from.FieldRef != nil && v.from.FieldRef.FieldPath == "spec.nodeName":
			val = pod.nodeName
		case v.from.FieldRef != nil && v.from.FieldRef.FieldPath == "status.hostIP":
			val = pod.hostIP
		case v.from.FieldRef != nil && strings.HasPrefix(v.from.FieldRef.FieldPath, "metadata.labels["):
			continue // no node labels copied out here: unset, as on a cluster before 1.35
		case v.from.ResourceFieldRef != nil && v.from.ResourceFieldRef.Resource == "limits.memory":
			q := c.Resources.Limits[corev1.ResourceMemory]
			val = fmt.Sprint(q.Value())
		default:
			t.Fatalf("%s: cannot resolve %+v outside a pod", k, v.from)
		}
		if o, ok := set[k]; ok {
			val = o
		}
		env = append(env, k+"="+val)
	}
	for _, a := range c.Args {
		if name, _, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasSuffix(name, "-addr") && strings.HasPrefix(a, "--") {
			addr, given := listen[name]
			if !given {
				addr = regtest.FreeAddr(t)
			}
			a = "--" + name + "=" + addr
		}
		args = append(args, a)
	}
	env = append(env, "KUBECONFIG="+kubeconfig, "HOME="+t.TempDir(), "PATH="+os.Getenv("PATH"))
	return args, env
}

// downward is what the downward API would tell a pod.
type downward struct{ namespace, nodeName, hostIP string }

// startProcess runs the binary with args and env until the test ends,
// then SIGTERMs it and waits; its output is kept for messages.
func startProcess(t *testing.T, bin string, args, env []string) (*syncBuf, func() error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	out := &syncBuf{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	var exitErr error
	stop := func() error {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case exitErr = <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				exitErr = fmt.Errorf("no exit 30s after SIGTERM: %v", <-done)
			}
		}
		return exitErr
	}
	t.Cleanup(func() { _ = stop() })
	return out, stop
}

// A registrar outside the cluster, run with the kubernetes-endpointslices
// overlay's own command line and environment and the registrar
// ServiceAccount's token (issued by the API server, as for a pod), works
// end to end on the kubernetes backend with exactly the manifests' RBAC:
// it becomes ready, a registration is persisted as an AetherEndpoint and
// published as an EndpointSlice, the agent DaemonSet's command line (as on
// a node) announces its node, which gets an AetherNode and a Lease, and
// nothing it does is forbidden. With the token of a ServiceAccount the
// manifests grant nothing, the same command is refused by RBAC.
func TestRegistrarWithTheServiceAccountTokenEndToEnd(t *testing.T) {
	bin := buildLikeDockerfile(t)
	srv := kubeapi.Start(t)
	r := render(t, "overlays/kubernetes-endpointslices")
	if _, err := applyYAML(t, srv.Kubeconfig, r.yaml); err != nil {
		t.Fatal(err)
	}
	p := typedParts(t, r)
	ns := p.deployments[0].Namespace
	sa := p.deployments[0].Spec.Template.Spec.ServiceAccountName
	kc := srv.WriteKubeconfig(t, "registrar", srv.ServiceAccountToken(t, ns, sa))

	reg := &p.deployments[0].Spec.Template.Spec.Containers[0]
	grpcAddr, httpAddr := regtest.FreeAddr(t), regtest.FreeAddr(t)
	listen := map[string]string{"grpc-addr": grpcAddr, "http-addr": httpAddr}
	args, env := podCommand(t, p, reg, downward{namespace: ns}, listen, nil, kc)
	t.Logf("aether %s (env %s)", strings.Join(args, " "), strings.Join(env, " "))
	out, stop := startProcess(t, bin, args, env)
	wait.ForState(t, "the registrar to be ready on the kubernetes backend", 90*time.Second, func() (bool, string) {
		resp, err := http.Get("http://" + httpAddr + "/readyz?verbose")
		if err != nil {
			return false, err.Error() + "\n" + out.String()
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status + "\n" + out.String()
	})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := regtest.Dial(t, grpcAddr)
	e := regtest.EP("web", "10.0.0.1", 8080)
	if _, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e, WaitPersisted: true}); err != nil {
		t.Fatalf("register (persisted): %v\n%s", err, out)
	}
	// The agent DaemonSet's own command line, as on node n1, pointed at
	// this registrar: it announces the node, whose record and Lease the
	// registrar writes with the same RBAC.
	agent := &p.daemonsets[0].Spec.Template.Spec.Containers[0]
	agentHTTP := regtest.FreeAddr(t)
	aargs, aenv := podCommand(t, p, agent, downward{namespace: ns, nodeName: "n1", hostIP: "127.0.0.1"},
		map[string]string{"http-addr": agentHTTP}, map[string]string{"AETHER_REGISTRAR": grpcAddr}, "")
	t.Logf("aether %s (env %s)", strings.Join(aargs, " "), strings.Join(aenv, " "))
	aout, stopAgent := startProcess(t, bin, aargs, aenv)
	wait.ForState(t, "the agent's /healthz", 60*time.Second, func() (bool, string) {
		resp, err := http.Get("http://" + agentHTTP + "/healthz")
		if err != nil {
			return false, err.Error() + "\n" + aout.String()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status + "\n" + aout.String()
	})

	// What the API server holds, read as the admin.
	dyn, err := dynamic.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	cs := srv.Clientset(t)
	list := func(gvr schema.GroupVersionResource, selector string) int {
		l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatalf("list %s: %v", gvr.Resource, err)
		}
		return len(l.Items)
	}
	aeps := schema.GroupVersionResource{Group: "aether.dev", Version: "v1alpha1", Resource: "aetherendpoints"}
	anodes := schema.GroupVersionResource{Group: "aether.dev", Version: "v1alpha1", Resource: "aethernodes"}
	if n := list(aeps, ""); n < 1 {
		t.Errorf("%d AetherEndpoints in %s after a persisted registration", n, ns)
	}
	wait.ForState(t, "the node's record and its Lease", 30*time.Second, func() (bool, string) {
		leases, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=aether"})
		if err != nil {
			return false, err.Error()
		}
		n := list(anodes, "")
		return n >= 1 && len(leases.Items) >= 1, fmt.Sprintf("%d AetherNodes, %d Leases", n, len(leases.Items))
	})
	wait.ForState(t, "an EndpointSlice of web", 30*time.Second, func() (bool, string) {
		sl, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
			LabelSelector: "endpointslice.kubernetes.io/managed-by=" + endpointslice.ManagedBy + ",kubernetes.io/service-name=web"})
		if err != nil {
			return false, err.Error()
		}
		for _, s := range sl.Items {
			for _, ep := range s.Endpoints {
				if len(ep.Addresses) == 1 && ep.Addresses[0] == "10.0.0.1" {
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("%d slices\n%s", len(sl.Items), out)
	})
	wait.ForState(t, "node n1 listed by the registrar", 30*time.Second, func() (bool, string) {
		r, err := c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, n := range r.GetNodes() {
			if n.GetNode().GetName() == "n1" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d nodes\n%s", len(r.GetNodes()), aout)
	})
	if err := stopAgent(); err != nil {
		t.Errorf("the agent's exit after SIGTERM: %v\n%s", err, aout)
	}
	if err := stop(); err != nil {
		t.Errorf("the registrar's exit after SIGTERM: %v\n%s", err, out)
	}
	if strings.Contains(strings.ToLower(out.String()), "forbidden") {
		t.Errorf("the registrar was refused something with the manifests' RBAC:\n%s", out)
	}

	// The same command with a token the manifests grant nothing: RBAC
	// refuses it, so the run above depended on the Role.
	nobody := srv.WriteKubeconfig(t, "nobody", srv.ServiceAccountToken(t, ns, "nobody"))
	httpAddr = regtest.FreeAddr(t)
	args, env = podCommand(t, p, reg, downward{namespace: ns}, map[string]string{"http-addr": httpAddr}, nil, nobody)
	out2, _ := startProcess(t, bin, args, env)
	wait.ForState(t, "the registrar without RBAC to be refused", 60*time.Second, func() (bool, string) {
		return strings.Contains(strings.ToLower(out2.String()), "forbidden"), out2.String()
	})
	if resp, err := http.Get("http://" + httpAddr + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("the registrar without RBAC is ready")
		}
	}
}
