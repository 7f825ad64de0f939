// Package kubeapi runs a real Kubernetes API server for a test: Kubernetes'
// own kube-apiserver (v1.37.2, built by tools/kubeapiserver/build.sh) as a
// child process on a free loopback port, on a real etcd (etcdtest's
// embedded member), with RBAC authorization, a bearer token for an admin
// in system:masters, and a service-account signing key so the TokenRequest
// API issues real ServiceAccount tokens. There is no kubelet, scheduler or
// controller manager: objects are created, validated, authorized and
// watched exactly as in a cluster, but nothing runs them.
//
// The binaries are found as $AETHER_KUBE_BIN (a directory holding
// kube-apiserver and kubectl), then in build.sh's cache
// ($HOME/.cache/aether-kube). A test that needs them and cannot find them
// fails naming the build command: the kubernetes backend's tests are the
// point, so they never skip.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// BuildHint is the command that builds the binaries where Dir looks.
const BuildHint = "tools/kubeapiserver/build.sh (what .ci/run does; about 4 minutes once per machine), or set AETHER_KUBE_BIN to a directory holding kube-apiserver and kubectl"

// Version is the Kubernetes version tools/kubeapiserver builds.
const Version = "v1.37.2"

// AdminUser is the user the admin token authenticates as.
const AdminUser = "aether-test-admin"

// startTimeout bounds one start: about 2 s on an idle machine, far more
// when the machine is busy with other tests' servers.
const startTimeout = 2 * time.Minute

// Dir finds the directory holding kube-apiserver and kubectl.
func Dir() (string, error) {
	if d := os.Getenv("AETHER_KUBE_BIN"); d != "" {
		if !executable(filepath.Join(d, "kube-apiserver")) {
			return "", fmt.Errorf("AETHER_KUBE_BIN=%s holds no kube-apiserver", d)
		}
		return d, nil
	}
	cache := os.Getenv("AETHER_KUBE_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "aether-kube")
	}
	// build.sh keys its directory on the module's sources, so an older
	// build may sit beside the current one; the newest complete one wins.
	dirs, _ := filepath.Glob(filepath.Join(cache, Version+"-*"))
	sort.Slice(dirs, func(i, j int) bool { return modTime(dirs[i]).After(modTime(dirs[j])) })
	for _, d := range dirs {
		if strings.HasSuffix(d, ".tmp") {
			continue
		}
		if executable(filepath.Join(d, "kube-apiserver")) && executable(filepath.Join(d, "kubectl")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("no kube-apiserver %s built in %s", Version, cache)
}

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

	etcd       *etcdtest.Cluster
	adminToken string
	cmd        *exec.Cmd
	out        *syncBuffer
	done       chan struct{}
	stopOnce   sync.Once
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
	s := &Server{etcd: etcd, adminToken: randomHex(t, 24), out: &syncBuffer{}, done: make(chan struct{})}

	keyFile := filepath.Join(dir, "sa.key")
	writeServiceAccountKey(t, keyFile)
	tokenFile := filepath.Join(dir, "tokens.csv")
	// token,user,uid,"group1,group2"
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", s.adminToken, AdminUser, AdminUser)
	if err := os.WriteFile(tokenFile, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}

	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		port := freePort(t)
		s.URL = "https://127.0.0.1:" + strconv.Itoa(port)
		args := []string{
			"--etcd-servers=" + strings.Join(etcd.Endpoints(), ","),
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(dir, "certs"),
			"--token-auth-file=" + tokenFile,
			"--service-account-key-file=" + keyFile,
			"--service-account-signing-key-file=" + keyFile,
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--api-audiences=https://kubernetes.default.svc.cluster.local",
			"--service-cluster-ip-range=10.96.0.0/24",
			"--authorization-mode=RBAC",
			// On a loopback advertise address the default reconciler
			// refuses to start; nothing here needs the kubernetes
			// Service's endpoints.
			"--endpoint-reconciler-type=none",
			"--allow-privileged=true",
			"--enable-priority-and-fairness=true",
			"--profiling=false",
			"-v=1",
		}
		args = append(args, o.args...)
		s.out.Reset()
		s.cmd = exec.Command(filepath.Join(bin, "kube-apiserver"), args...)
		s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("kubeapi: start: %v", err)
		}
		s.done = make(chan struct{})
		go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
		if lastErr = s.waitReady(); lastErr == nil {
			break
		}
		s.kill()
		if !strings.Contains(s.out.String(), "address already in use") {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("kubeapi: %v\n--- kube-apiserver output (tail)\n%s", lastErr, tail(s.out.String(), 60))
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("--- kube-apiserver output (tail)\n%s", tail(s.out.String(), 40))
		}
	})

	s.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := clientcmd.WriteToFile(s.kubeconfig("admin", s.adminToken), s.Kubeconfig); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitReady polls /readyz until the server answers ok (every post-start
// hook done, RBAC's bootstrap roles among them) or the process exits.
func (s *Server) waitReady() error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(startTimeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("kube-apiserver exited before it was ready")
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.adminToken)
		resp, err := hc.Do(req)
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("readyz %d: %s", resp.StatusCode, body[:n])
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond) // a poll interval, not a wait for a condition
	}
	return fmt.Errorf("kube-apiserver not ready after %v (last: %s)", startTimeout, last)
}

// Config returns a client configuration for the admin user (a member of
// system:masters: every request is allowed). Each call returns a new copy.
func (s *Server) Config() *rest.Config {
	return s.config(s.adminToken)
}

func (s *Server) config(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		// Tests create many objects quickly; client-go's default of 5 QPS
		// would make them wait on the client, not the server.
		QPS:   1000,
		Burst: 1000,
	}
}

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
// older resourceVersion answers 410 Gone.
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
	return s.config(s.ServiceAccountToken(t, namespace, name))
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
	if err := clientcmd.WriteToFile(s.kubeconfig(user, token), p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *Server) kubeconfig(user, token string) clientcmdapi.Config {
	return clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"kubeapi": {Server: s.URL, InsecureSkipTLSVerify: true}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {Token: token}},
		Contexts:       map[string]*clientcmdapi.Context{user: {Cluster: "kubeapi", AuthInfo: user}},
		CurrentContext: user,
	}
}

// Stop stops the API server (not its etcd, which the test's cleanup
// stops after it).
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd == nil || s.cmd.Process == nil {
			return
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			s.kill()
		}
	})
}

func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Output is what the API server has printed so far.
func (s *Server) Output() string { return s.out.String() }

func writeServiceAccountKey(t testing.TB, path string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func modTime(p string) time.Time {
	st, err := os.Stat(p)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// syncBuffer is a bytes.Buffer the child's output goroutines and the test
// may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Bound what a long test keeps: the tail is what a failure needs.
	if b.b.Len() > 4<<20 {
		rest := b.b.Bytes()[b.b.Len()-1<<20:]
		b.b.Reset()
		b.b.Write(rest)
	}
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Reset()
}
