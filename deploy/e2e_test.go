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
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/kube/endpointslice"
)

// podCommand is the registrar's command line and environment as the
// kubelet would run it from the manifests, outside a pod: ConfigMap and
// env values resolved (the downward API's namespace, the memory limit),
// the listeners moved to free loopback ports, and KUBECONFIG standing in
// for the token the kubelet would mount.
func podCommand(t *testing.T, p *parts, kubeconfig string) (args, env []string, grpcAddr, httpAddr string) {
	t.Helper()
	c := &p.deployments[0].Spec.Template.Spec.Containers[0]
	vars, err := p.env(c)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range vars {
		val := v.value
		switch {
		case v.from == nil:
		case v.from.FieldRef != nil && v.from.FieldRef.FieldPath == "metadata.namespace":
			val = p.deployments[0].Namespace
		case v.from.FieldRef != nil && strings.HasPrefix(v.from.FieldRef.FieldPath, "metadata.labels["):
			continue // no node labels out here
		case v.from.ResourceFieldRef != nil && v.from.ResourceFieldRef.Resource == "limits.memory":
			q := c.Resources.Limits[corev1.ResourceMemory]
			val = fmt.Sprint(q.Value())
		default:
			t.Fatalf("%s: cannot resolve %+v outside a pod", k, v.from)
		}
		env = append(env, k+"="+val)
	}
	grpcAddr, httpAddr = regtest.FreeAddr(t), regtest.FreeAddr(t)
	for _, a := range c.Args {
		switch {
		case strings.HasPrefix(a, "--grpc-addr="):
			a = "--grpc-addr=" + grpcAddr
		case strings.HasPrefix(a, "--http-addr="):
			a = "--http-addr=" + httpAddr
		case strings.HasPrefix(a, "--xds-addr="):
			a = "--xds-addr=" + regtest.FreeAddr(t)
		}
		args = append(args, a)
	}
	env = append(env, "KUBECONFIG="+kubeconfig, "HOME="+t.TempDir(), "PATH="+os.Getenv("PATH"))
	return args, env, grpcAddr, httpAddr
}

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
// published as an EndpointSlice, a node announcement gets its Lease, and
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

	args, env, grpcAddr, httpAddr := podCommand(t, p, kc)
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
	if _, err := c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1", Address: "10.0.0.9"}}); err != nil {
		t.Fatalf("announce node: %v\n%s", err, out)
	}

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
	if err := stop(); err != nil {
		t.Errorf("the registrar's exit after SIGTERM: %v\n%s", err, out)
	}
	if strings.Contains(strings.ToLower(out.String()), "forbidden") {
		t.Errorf("the registrar was refused something with the manifests' RBAC:\n%s", out)
	}

	// The same command with a token the manifests grant nothing: RBAC
	// refuses it, so the run above depended on the Role.
	nobody := srv.WriteKubeconfig(t, "nobody", srv.ServiceAccountToken(t, ns, "nobody"))
	args, env, _, httpAddr = podCommand(t, p, nobody)
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
