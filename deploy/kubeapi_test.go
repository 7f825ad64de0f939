package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/testutil/kubeapi"
)

// runKubectl runs kubectl against the server of kubeconfig.
func runKubectl(t *testing.T, kubeconfig string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(kubectl(t), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// applyYAML applies manifests as an operator would, with the API server
// validating strictly (an unknown or duplicate field is an error, not
// dropped) and server-side apply. It returns kubectl's stderr, where the
// API server's warnings (Pod Security among them) are printed.
func applyYAML(t *testing.T, kubeconfig string, yaml []byte) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(f, yaml, 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runKubectl(t, kubeconfig, "apply", "--server-side", "--field-manager=aether-deploy-test", "--validate=strict", "-f", f)
	if err != nil {
		return stderr, fmt.Errorf("kubectl apply: %v\n%s%s", err, out, stderr)
	}
	return stderr, nil
}

// Every overlay and component combination applies to a real API server:
// each object is accepted and validated (schemas, strict fields,
// admission), the Pod Security admission has no warning for any pod
// template (the namespace warns on "restricted"), and every object is
// there afterwards. Nothing runs the pods (no kubelet); that is not the
// point.
func TestManifestsApplyToAPIServer(t *testing.T) {
	srv := kubeapi.Start(t)
	for _, r := range everything(t) {
		stderr, err := applyYAML(t, srv.Kubeconfig, r.yaml)
		if err != nil {
			t.Errorf("%s: %v", r.dir, err)
			continue
		}
		if strings.Contains(stderr, "Warning:") {
			t.Errorf("%s: the API server warned:\n%s", r.dir, stderr)
		}
		var want []string
		for _, o := range r.objs {
			want = append(want, o.GetKind()+"/"+o.GetName())
		}
		for _, o := range r.objs {
			args := []string{"get", o.GetKind() + "." + strings.SplitN(o.GetAPIVersion()+"/", "/", 2)[0], o.GetName(), "-o", "name"}
			if !strings.Contains(o.GetAPIVersion(), "/") {
				args[1] = o.GetKind()
			}
			if ns := o.GetNamespace(); ns != "" {
				args = append(args, "-n", ns)
			}
			if out, stderr, err := runKubectl(t, srv.Kubeconfig, args...); err != nil || strings.TrimSpace(out) == "" {
				t.Errorf("%s: %s %s not found after apply: %v %s", r.dir, o.GetKind(), o.GetName(), err, stderr)
			}
		}
		t.Logf("%s: applied %d objects: %s", r.dir, len(r.objs), strings.Join(want, " "))
	}

	// The same checks fail on a broken manifest: a root pod template draws
	// the Pod Security warning, an unknown field is refused.
	p := render(t, "overlays/etcd")
	root := bytes.Replace(p.yaml, []byte("runAsUser: 65532"), []byte("runAsUser: 0"), 1)
	if bytes.Equal(root, p.yaml) {
		t.Fatal("no runAsUser: 65532 in overlays/etcd to break")
	}
	stderr, err := applyYAML(t, srv.Kubeconfig, root)
	if err != nil || !strings.Contains(stderr, `would violate PodSecurity "restricted`) {
		t.Errorf("a root pod template: want a Pod Security warning, got err %v, stderr %q", err, stderr)
	}
	unknown := bytes.Replace(p.yaml, []byte("readOnlyRootFilesystem: true"), []byte("readOnlyRootFileSystem: true"), 1)
	if _, err := applyYAML(t, srv.Kubeconfig, unknown); err == nil || !strings.Contains(err.Error(), "readOnlyRootFileSystem") {
		t.Errorf("a misspelt field: want the API server to refuse it, got %v", err)
	}
}

// canIList is `kubectl auth can-i --list` as the user of kubeconfig in
// namespace ns, as permissions (non-resource URLs as group "nonresource").
func canIList(t *testing.T, kubeconfig, ns string) map[permission]bool {
	t.Helper()
	out, stderr, err := runKubectl(t, kubeconfig, "auth", "can-i", "--list", "-n", ns)
	if err != nil {
		t.Fatalf("kubectl auth can-i --list -n %s: %v\n%s", ns, err, stderr)
	}
	row := regexp.MustCompile(`^(\S*)\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$`)
	perms := map[permission]bool{}
	for i, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if i == 0 {
			if !strings.HasPrefix(line, "Resources") {
				t.Fatalf("kubectl auth can-i --list: unexpected header %q", line)
			}
			continue
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("kubectl auth can-i --list: cannot read %q", line)
		}
		names := strings.Fields(m[3])
		if len(names) == 0 {
			names = []string{""}
		}
		if m[1] == "" {
			for _, u := range strings.Fields(m[2]) {
				for _, v := range strings.Fields(m[4]) {
					perms[permission{"nonresource", u, "", v}] = true
				}
			}
			continue
		}
		res, group, _ := strings.Cut(m[1], ".")
		for _, n := range names {
			for _, v := range strings.Fields(m[4]) {
				perms[permission{group, res, n, v}] = true
			}
		}
	}
	return perms
}

// granted is what the registrar's ServiceAccount may do in ns beyond what
// any ServiceAccount may (a ServiceAccount with no binding, asked the same
// way, is the baseline: discovery, self reviews).
func granted(t *testing.T, srv *kubeapi.Server, ns string) map[permission]bool {
	t.Helper()
	reg := srv.WriteKubeconfig(t, "registrar", srv.ServiceAccountToken(t, "aether-system", "aether-registrar"))
	base := srv.WriteKubeconfig(t, "nobody", srv.ServiceAccountToken(t, "aether-system", "nobody"))
	baseline := canIList(t, base, ns)
	out := map[permission]bool{}
	for p := range canIList(t, reg, ns) {
		if !baseline[p] {
			out[p] = true
		}
	}
	return out
}

func sortedPerms(m map[permission]bool) string {
	var s []string
	for p := range m {
		s = append(s, p.String())
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

// kubectl auth can-i, as the registrar's ServiceAccount with a token the
// API server issued (as a pod's), shows exactly the backends' rules and
// nothing more: in its namespace, elsewhere (only the cluster-scoped CRD
// reads), on etcd (nothing). Then a Role with one extra verb makes the
// comparison fail.
func TestServiceAccountCanDoExactlyTheBackendsRules(t *testing.T) {
	srv := kubeapi.Start(t)

	etcd := render(t, "overlays/etcd")
	if _, err := applyYAML(t, srv.Kubeconfig, etcd.yaml); err != nil {
		t.Fatal(err)
	}
	if g := granted(t, srv, "aether-system"); len(g) > 0 {
		t.Errorf("on etcd the registrar's ServiceAccount may: %s; want nothing", sortedPerms(g))
	}

	kube := render(t, "overlays/kubernetes-endpointslices")
	if _, err := applyYAML(t, srv.Kubeconfig, kube.yaml); err != nil {
		t.Fatal(err)
	}
	want := flatten(wantRules(t, typedParts(t, kube)))
	if len(want) == 0 {
		t.Fatal("no rules expected of the kubernetes-endpointslices overlay")
	}
	got := granted(t, srv, "aether-system")
	if d := diffPermissions(want, got); len(d) > 0 {
		t.Errorf("kubectl auth can-i --list as the registrar in aether-system differs from RequiredRules:\n  %s", strings.Join(d, "\n  "))
	}
	t.Logf("the registrar's ServiceAccount may, beyond any ServiceAccount: %s", sortedPerms(got))

	wantElsewhere := map[permission]bool{}
	for p := range want {
		if clusterScoped[p.group+"/"+p.resource] {
			wantElsewhere[p] = true
		}
	}
	if d := diffPermissions(wantElsewhere, granted(t, srv, "default")); len(d) > 0 {
		t.Errorf("in namespace default the registrar may more (or less) than read its CRDs:\n  %s", strings.Join(d, "\n  "))
	}

	// One verb more, and the same comparison fails.
	extra := []byte(`apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: aether-registrar-extra, namespace: aether-system}
rules:
  - apiGroups: ["aether.dev"]
    resources: ["aetherendpoints"]
    verbs: ["deletecollection"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: aether-registrar-extra, namespace: aether-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: aether-registrar-extra}
subjects: [{kind: ServiceAccount, name: aether-registrar, namespace: aether-system}]
`)
	if _, err := applyYAML(t, srv.Kubeconfig, extra); err != nil {
		t.Fatal(err)
	}
	d := diffPermissions(want, granted(t, srv, "aether-system"))
	if len(d) != 1 || d[0] != "extra: deletecollection aetherendpoints.aether.dev" {
		t.Errorf("with an extra Role the comparison says %q, want exactly the extra verb", d)
	}
}
