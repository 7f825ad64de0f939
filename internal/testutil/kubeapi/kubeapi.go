// Package kubeapi runs a real Kubernetes API server for a test: Kubernetes'
// own kube-apiserver (v1.37.2, built by tools/kubeapiserver/build.sh),
// started by internal/kubeapiserver as a child process on a free loopback
// port, on a real etcd (etcdtest's embedded member), with RBAC
// authorization, an admin token (system:masters) and a service-account
// signing key so the TokenRequest API issues real ServiceAccount tokens.
// There is no kubelet, scheduler or controller manager: objects are
// created, validated, authorized and watched exactly as in a cluster, but
// nothing runs them.
//
// A test that needs the binaries and cannot find them fails naming the
// build command: the kubernetes backend's tests are the point, so they
// never skip.
package kubeapi

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/aethermesh/aether/internal/kubeapiserver"
	"github.com/aethermesh/aether/internal/tailbuf"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// BuildHint is the command that builds the binaries.
const BuildHint = kubeapiserver.BuildHint

// Version is the Kubernetes version the tests run.
const Version = kubeapiserver.Version

// AdminUser is the user the admin token authenticates as.
const AdminUser = kubeapiserver.AdminUser

// Dir finds the directory holding kube-apiserver and kubectl.
func Dir() (string, error) { return kubeapiserver.Dir() }

// Kubectl returns the path of the kubectl built beside the API server, so
// a test drives the same version it talks to.
func Kubectl(t testing.TB) string {
	t.Helper()
	d, err := Dir()
	if err != nil {
		t.Fatalf("kubeapi: %v; build it with %s", err, BuildHint)
	}
	return filepath.Join(d, "kubectl")
}

// Server is a running API server and its etcd.
type Server struct {
	// URL is the API server's https address.
	URL string
	// Kubeconfig is a kubeconfig file for the admin user.
	Kubeconfig string

	etcd *etcdtest.Cluster
	srv  *kubeapiserver.Server
}

// Option changes how Start runs the API server.
type Option func(*options)

type options struct{ args []string }

// WithoutWatchCache turns the API server's watch cache off, so lists and
// watches at a resourceVersion go to etcd: an etcd compaction then answers
// 410 Gone at once. With the cache on (the default, as in a cluster) the
// server answers old resourceVersions from its memory while they are in
// its window, and 410 only once they fall out of it.
func WithoutWatchCache() Option {
	return func(o *options) { o.args = append(o.args, "--watch-cache=false") }
}

// WithArgs passes more kube-apiserver flags.
func WithArgs(args ...string) Option {
	return func(o *options) { o.args = append(o.args, args...) }
}

// Start runs an API server for t and stops it when t ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var o options
	for _, f := range opts {
		f(&o)
	}
	bin, err := Dir()
	if err != nil {
		t.Fatalf("kubeapi: %v; build it with %s", err, BuildHint)
	}
	etcd := etcdtest.Start(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), kubeapiserver.StartTimeout+10*time.Second)
	defer cancel()
	srv, err := kubeapiserver.Start(ctx, kubeapiserver.Config{BinDir: bin, EtcdServers: etcd.Endpoints(), Dir: dir, Args: o.args})
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	s := &Server{URL: srv.URL, etcd: etcd, srv: srv}
	// Registered after etcdtest's cleanup, so it runs first: the API
	// server stops before its etcd.
	t.Cleanup(func() {
		srv.Stop()
		if t.Failed() {
			t.Logf("--- kube-apiserver output (tail)\n%s", tailbuf.Lines(srv.Output(), 40))
		}
	})
	s.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := srv.WriteKubeconfig(s.Kubeconfig, "admin", srv.AdminToken); err != nil {
		t.Fatal(err)
	}
	return s
}

// Config returns a client configuration for the admin user (a member of
// system:masters: every request is allowed). Each call returns a new copy.
func (s *Server) Config() *rest.Config { return s.srv.Config(s.srv.AdminToken) }

// Clientset is a typed client for the admin user.
func (s *Server) Clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// EtcdClient returns a client of the API server's etcd, so a test can
// force a compaction (a watch or list then gets 410 Gone).
func (s *Server) EtcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	return s.etcd.Client(t)
}

// Compact compacts the API server's etcd at its current revision, so any
// older resourceVersion answers 410 Gone (at once without the watch
// cache; with it, once the version leaves the cache's window).
func (s *Server) Compact(t testing.TB) int64 {
	t.Helper()
	c := s.EtcdClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "compact-probe")
	if err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.Revision
	if _, err := c.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	return rev
}

// ServiceAccountConfig returns a client configuration acting as the
// ServiceAccount namespace/name, with a token the API server issued
// through the TokenRequest API (as the kubelet projects into a pod). The
// namespace and the ServiceAccount are created when absent; the
// ServiceAccount has only what RBAC grants it.
func (s *Server) ServiceAccountConfig(t testing.TB, namespace, name string) *rest.Config {
	t.Helper()
	return s.srv.Config(s.ServiceAccountToken(t, namespace, name))
}

// ServiceAccountToken returns a token of the ServiceAccount
// namespace/name, creating both when absent.
func (s *Server) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	cs := s.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubeapi: namespace %s: %v", namespace, err)
	}
	_, err = cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubeapi: serviceaccount %s/%s: %v", namespace, name, err)
	}
	secs := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeapi: token for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// WriteKubeconfig writes a kubeconfig for a bearer token (for example a
// ServiceAccount's) and returns its path.
func (s *Server) WriteKubeconfig(t testing.TB, user, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), user+".kubeconfig")
	if err := s.srv.WriteKubeconfig(p, user, token); err != nil {
		t.Fatal(err)
	}
	return p
}

// Stop stops the API server (not its etcd, which the test's cleanup
// stops after it).
func (s *Server) Stop() { s.srv.Stop() }

// Output is what the API server has printed so far.
func (s *Server) Output() string { return s.srv.Output() }
