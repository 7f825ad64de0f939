package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/aethermesh/aether/internal/testutil/kubeapi"
)

// kubectl finds kubectl: $AETHER_KUBECTL, else the one built beside the
// test API server (tools/kubeapiserver, the version the tests talk to),
// else on PATH. The tests need it for kustomize (kubectl kustomize is the
// renderer operators run) and to apply and query as operators do; without
// it they fail, saying how to get it.
func kubectl(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("AETHER_KUBECTL"); p != "" {
		return p
	}
	if d, err := kubeapi.Dir(); err == nil {
		return filepath.Join(d, "kubectl")
	}
	p, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("no kubectl: not built by %s, nor on PATH, nor $AETHER_KUBECTL: the manifests' tests render with kubectl kustomize and apply with kubectl", kubeapi.BuildHint)
	}
	return p
}

// rendered is one kustomization's output, decoded.
type rendered struct {
	dir  string
	yaml []byte
	objs []*unstructured.Unstructured
}

// render runs kubectl kustomize on dir.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	cmd := exec.Command(kubectl(t), "kustomize", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	r := &rendered{dir: dir, yaml: out}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("decode the output of kubectl kustomize %s: %v", dir, err)
		}
		if m == nil {
			continue
		}
		r.objs = append(r.objs, &unstructured.Unstructured{Object: m})
	}
	return r
}

// overlays are the deployable kustomizations under overlays/.
func overlays(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob("overlays/*/kustomization.yaml")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no overlays found: %v", err)
	}
	for i, d := range dirs {
		dirs[i] = filepath.Dir(d)
	}
	sort.Strings(dirs)
	return dirs
}

// combos are kustomizations the overlays do not spell out: every component
// on both kinds of workload, so each component's patches are rendered and
// checked at least once.
var combos = map[string]struct {
	resources  []string
	components []string
	settings   []string // AETHER_* literals merged into the registrar's settings
}{
	"etcd-mtls":               {[]string{"base"}, []string{"components/etcd", "components/tls", "components/mtls", "components/etcd-tls"}, []string{"AETHER_ETCD_ENDPOINTS=https://etcd:2379", "AETHER_TRUST_DOMAIN=example.org"}},
	"etcd-endpointslices":     {[]string{"base", "agent"}, []string{"components/etcd", "components/endpointslices"}, []string{"AETHER_ETCD_ENDPOINTS=http://etcd:2379"}},
	"kubernetes-tls":          {[]string{"base", "agent"}, []string{"components/kubernetes", "components/tls"}, nil},
	"embedded-etcd-tls":       {[]string{"overlays/embedded-etcd"}, []string{"components/tls"}, nil},
	"embedded-etcd-kubeslice": {[]string{"overlays/embedded-etcd"}, []string{"components/endpointslices"}, nil},
	"etcd-peer-watch":         {[]string{"base", "agent"}, []string{"components/etcd", "components/peer-watch"}, []string{"AETHER_ETCD_ENDPOINTS=http://etcd:2379"}},
	"kubernetes-peer-watch":   {[]string{"base", "agent"}, []string{"components/kubernetes", "components/peer-watch"}, nil},
}

// renderCombo writes a kustomization for combos[name] in a temp dir and
// renders it.
func renderCombo(t *testing.T, name string) *rendered {
	t.Helper()
	c := combos[name]
	dir := t.TempDir()
	// kustomize takes no absolute paths of kustomizations: relative to dir.
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(dir, a)
		if err != nil {
			t.Fatal(err)
		}
		return rel
	}
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n")
	for _, r := range c.resources {
		fmt.Fprintf(&b, "  - %s\n", abs(r))
	}
	b.WriteString("components:\n")
	for _, r := range c.components {
		fmt.Fprintf(&b, "  - %s\n", abs(r))
	}
	if len(c.settings) > 0 {
		b.WriteString("configMapGenerator:\n  - name: aether-registrar-settings\n    behavior: merge\n    literals:\n")
		for _, s := range c.settings {
			fmt.Fprintf(&b, "      - %s\n", s)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	r := render(t, dir)
	r.dir = "combo " + name
	return r
}

// everything renders every overlay and every combo.
func everything(t *testing.T) []*rendered {
	t.Helper()
	var all []*rendered
	for _, d := range overlays(t) {
		all = append(all, render(t, d))
	}
	names := make([]string, 0, len(combos))
	for n := range combos {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		all = append(all, renderCombo(t, n))
	}
	return all
}

// typed converts the objects of one kind into typed API objects.
func typed[T any](t *testing.T, r *rendered, kind string) []*T {
	t.Helper()
	var out []*T
	for _, o := range r.objs {
		if o.GetKind() != kind {
			continue
		}
		v := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, v, true); err != nil {
			t.Fatalf("%s: %s %s: %v", r.dir, kind, o.GetName(), err)
		}
		out = append(out, v)
	}
	return out
}

// parts is a rendered kustomization's objects, typed.
type parts struct {
	name         string
	deployments  []*appsv1.Deployment
	statefulsets []*appsv1.StatefulSet
	daemonsets   []*appsv1.DaemonSet
	services     []*corev1.Service
	configmaps   []*corev1.ConfigMap
	sas          []*corev1.ServiceAccount
	pdbs         []*policyv1.PodDisruptionBudget
	roles        []*rbacv1.Role
	roleBindings []*rbacv1.RoleBinding
	cRoles       []*rbacv1.ClusterRole
	cRoleBinds   []*rbacv1.ClusterRoleBinding
}

func typedParts(t *testing.T, r *rendered) *parts {
	t.Helper()
	return &parts{
		name:         r.dir,
		deployments:  typed[appsv1.Deployment](t, r, "Deployment"),
		statefulsets: typed[appsv1.StatefulSet](t, r, "StatefulSet"),
		daemonsets:   typed[appsv1.DaemonSet](t, r, "DaemonSet"),
		services:     typed[corev1.Service](t, r, "Service"),
		configmaps:   typed[corev1.ConfigMap](t, r, "ConfigMap"),
		sas:          typed[corev1.ServiceAccount](t, r, "ServiceAccount"),
		pdbs:         typed[policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget"),
		roles:        typed[rbacv1.Role](t, r, "Role"),
		roleBindings: typed[rbacv1.RoleBinding](t, r, "RoleBinding"),
		cRoles:       typed[rbacv1.ClusterRole](t, r, "ClusterRole"),
		cRoleBinds:   typed[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding"),
	}
}

// workload is one pod template of a rendered kustomization, with what it
// is: the registrar's (Deployment or StatefulSet) or the agent's.
type workload struct {
	kind, name string
	replicas   int32
	pod        *corev1.PodTemplateSpec
}

func (p *parts) workloads() []workload {
	var w []workload
	for _, d := range p.deployments {
		w = append(w, workload{"Deployment", d.Name, deref(d.Spec.Replicas, 1), &d.Spec.Template})
	}
	for _, s := range p.statefulsets {
		w = append(w, workload{"StatefulSet", s.Name, deref(s.Spec.Replicas, 1), &s.Spec.Template})
	}
	for _, d := range p.daemonsets {
		w = append(w, workload{"DaemonSet", d.Name, 0, &d.Spec.Template})
	}
	return w
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// configMap returns the ConfigMap named name (kustomize's hashed name).
func (p *parts) configMap(name string) *corev1.ConfigMap {
	for _, c := range p.configmaps {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// env is the environment a container gets: its envFrom ConfigMaps' data
// overlaid by its env (as the kubelet does), with the source of each value.
type envVar struct {
	value string
	from  *corev1.EnvVarSource // set for a downward-API/resource value
	src   string               // where it came from, for messages
}

func (p *parts) env(c *corev1.Container) (map[string]envVar, error) {
	env := map[string]envVar{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			return nil, fmt.Errorf("container %s: envFrom other than a ConfigMap", c.Name)
		}
		cm := p.configMap(ef.ConfigMapRef.Name)
		if cm == nil {
			return nil, fmt.Errorf("container %s: envFrom ConfigMap %s is not in the manifests", c.Name, ef.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			env[ef.Prefix+k] = envVar{value: v, src: "ConfigMap " + cm.Name}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = envVar{value: e.Value, from: e.ValueFrom, src: "env"}
	}
	return env, nil
}

// syncBuf is a bytes.Buffer a child process's output goroutine and the
// test may use at once.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
