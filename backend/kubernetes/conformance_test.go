package kubernetes

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/wait"
)

var (
	_ backend.Store    = (*Store)(nil)
	_ backend.Watcher  = (*Store)(nil)
	_ backend.Digester = (*Store)(nil)
)

// nsSeq numbers the namespaces of one test binary's stores.
var nsSeq atomic.Int64

// freshNamespace creates a namespace of its own for one store: a fresh
// store is an empty namespace, while revisions carry on across them as
// the API server's etcd does, which the suite must not mind. (There is
// no namespace controller without a controller manager, so namespaces are
// left behind with the server, which t.Cleanup stops.)
func freshNamespace(t backendtest.T, cs kubernetes.Interface) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("aether-t%d", nsSeq.Add(1))
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	return name
}

// openStore opens a Store on the namespace, installing the CRDs (the
// first store of a server installs them; later ones find them and apply
// them unchanged).
func openStore(t backendtest.T, srv *kubeapi.Server, ns string, tweak func(*Config)) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{RESTConfig: srv.Config(), Namespace: ns, Region: "r1", Cluster: "c1", InstallCRDs: true}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// compactAPIServer compacts the API server's etcd at rev as the API
// server's own compactor does (recording the revision in compact_rev_key,
// which the API server watches, then compacting), and waits until the
// API server refuses a read below rev: its watch cache learns of a
// compaction by polling (every 15 s), and serves lists at older revisions
// from its snapshots until then.
func compactAPIServer(t backendtest.T, cli *clientv3.Client, s *Store, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "compact_rev_key", strconv.FormatInt(rev, 10)); err != nil {
		t.Fatalf("recording the compaction at %d: %v", rev, err)
	}
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact at %d: %v", rev, err)
	}
	wait.ForState(t, fmt.Sprintf("the API server to refuse reads below the compaction at %d", rev), 45*time.Second, func() (bool, string) {
		compacted, err := s.compactedAt(ctx, rev-1)
		return compacted, fmt.Sprintf("compacted %v, err %v", compacted, err)
	})
}

func TestConformance(t *testing.T) {
	srv := kubeapi.Start(t)
	cs := srv.Clientset(t)
	etcd := srv.EtcdClient(t)
	backendtest.RunAll(t, backendtest.Factory{
		New: func(t backendtest.T) backend.Store {
			return openStore(t, srv, freshNamespace(t, cs), nil)
		},
		Compact: func(t backendtest.T, b backend.Store, rev int64) {
			compactAPIServer(t, etcd, b.(*Store), rev)
		},
	})
}

// TestCRDCheck: without InstallCRDs a cluster lacking the CRDs is refused
// with an error that names the fix; once installed, a store opens without
// installing.
func TestCRDCheck(t *testing.T) {
	srv := kubeapi.Start(t)
	cs := srv.Clientset(t)
	ns := freshNamespace(t, cs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := New(ctx, Config{RESTConfig: srv.Config(), Namespace: ns})
	if err == nil {
		t.Fatalf("New without the CRDs installed succeeded")
	}
	for _, want := range []string{"aetherendpoints.aether.dev", "kubectl apply -f backend/kubernetes/crds/", "InstallCRDs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	openStore(t, srv, ns, nil)
	s, err := New(ctx, Config{RESTConfig: srv.Config(), Namespace: ns})
	if err != nil {
		t.Fatalf("New with the CRDs installed: %v", err)
	}
	_ = s.Close()
	if _, err := New(ctx, Config{RESTConfig: srv.Config(), Namespace: "Not_A_Namespace"}); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("an invalid namespace: %v", err)
	}
}
