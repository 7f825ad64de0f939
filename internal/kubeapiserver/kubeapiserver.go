// Package kubeapiserver runs Kubernetes' own kube-apiserver (v1.37.2, built
// by tools/kubeapiserver/build.sh) as a child process on a loopback port, on
// an etcd the caller runs, with RBAC authorization, a bearer token for an
// admin in system:masters and a service-account signing key (so the
// TokenRequest API issues real ServiceAccount tokens). Nothing runs what it
// stores: there is no kubelet, scheduler or controller manager.
//
// The tests (internal/testutil/kubeapi) and the benchmark harness (the
// kubernetes scenario) both start API servers through it; it lives outside
// internal/testutil because the harness ships in the aether binary.
package kubeapiserver

import (
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
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/aethermesh/aether/internal/tailbuf"
)

// BuildHint is the command that builds the binaries where Dir looks.
const BuildHint = "tools/kubeapiserver/build.sh (what .ci/run does; about 4 minutes once per machine), or set AETHER_KUBE_BIN to a directory holding kube-apiserver and kubectl"

// Version is the Kubernetes version tools/kubeapiserver builds.
const Version = "v1.37.2"

// AdminUser is the user the admin token authenticates as.
const AdminUser = "aether-admin"

// StartTimeout bounds one start: about 2 s on an idle machine, far more
// when the machine is busy.
const StartTimeout = 2 * time.Minute

// Dir finds the directory holding kube-apiserver and kubectl:
// $AETHER_KUBE_BIN, else the newest complete build in build.sh's cache
// ($AETHER_KUBE_CACHE, else $XDG_CACHE_HOME/aether-kube or
// ~/.cache/aether-kube).
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

// Config says how to run one API server.
type Config struct {
	// BinDir holds kube-apiserver; empty: Dir().
	BinDir string
	// EtcdServers are the etcd client URLs it stores in.
	EtcdServers []string
	// Dir is where it keeps its keys, certificates and token file; it
	// must exist and outlive the process.
	Dir string
	// Args are more kube-apiserver flags.
	Args []string
}

// Server is a running API server.
type Server struct {
	// URL is its https address.
	URL string
	// AdminToken authenticates as AdminUser, in system:masters.
	AdminToken string

	cmd      *exec.Cmd
	out      *tailbuf.Buffer
	done     chan struct{}
	stopOnce sync.Once
}

// Start runs an API server and waits until /readyz answers ok (every
// post-start hook done, RBAC's bootstrap roles among them).
func Start(ctx context.Context, cfg Config) (*Server, error) {
	bin := cfg.BinDir
	if bin == "" {
		d, err := Dir()
		if err != nil {
			return nil, fmt.Errorf("%w; build it with %s", err, BuildHint)
		}
		bin = d
	}
	token, err := randomHex(24)
	if err != nil {
		return nil, err
	}
	s := &Server{AdminToken: token, out: &tailbuf.Buffer{}}
	keyFile := filepath.Join(cfg.Dir, "sa.key")
	if err := writeServiceAccountKey(keyFile); err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(cfg.Dir, "tokens.csv")
	// token,user,uid,"group1,group2"
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", token, AdminUser, AdminUser)
	if err := os.WriteFile(tokenFile, []byte(line), 0o600); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s.URL = "https://127.0.0.1:" + strconv.Itoa(port)
		args := []string{
			"--etcd-servers=" + strings.Join(cfg.EtcdServers, ","),
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(cfg.Dir, "certs"),
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
		args = append(args, cfg.Args...)
		s.out.Reset()
		s.cmd = exec.Command(filepath.Join(bin, "kube-apiserver"), args...)
		s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
		// The API server must not outlive whoever started it, even on a
		// kill -9 of the parent.
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start kube-apiserver: %w", err)
		}
		s.done = make(chan struct{})
		go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
		if lastErr = s.waitReady(ctx); lastErr == nil {
			return s, nil
		}
		s.kill()
		if !strings.Contains(s.out.String(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("%w\n--- kube-apiserver output (tail)\n%s", lastErr, s.out.Tail(60))
}

func (s *Server) waitReady(ctx context.Context) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(StartTimeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("kube-apiserver exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.AdminToken)
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
	return fmt.Errorf("kube-apiserver not ready after %v (last: %s)", StartTimeout, last)
}

// Config returns a client configuration for bearer token (AdminToken for
// the admin). The server's certificate is self-signed: it is not
// verified.
func (s *Server) Config(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		// client-go's default of 5 QPS would make tests and benchmarks
		// wait on the client, not the server.
		QPS:   1000,
		Burst: 1000,
	}
}

// WriteKubeconfig writes a kubeconfig for user with token to path.
func (s *Server) WriteKubeconfig(path, user, token string) error {
	return clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"kubeapi": {Server: s.URL, InsecureSkipTLSVerify: true}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {Token: token}},
		Contexts:       map[string]*clientcmdapi.Context{user: {Cluster: "kubeapi", AuthInfo: user}},
		CurrentContext: user,
	}, path)
}

// Pid is the API server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Output is what the API server has printed so far (its last MiB or so).
func (s *Server) Output() string { return s.out.String() }

// Stop stops the API server: SIGTERM, then SIGKILL after 15 s.
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

func writeServiceAccountKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return os.WriteFile(path, b, 0o600)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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
