package kubeapi_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/internal/testutil/kubeapi"
)

// TestServer checks what the backend's tests rely on: the admin may do
// anything, a ServiceAccount only what RBAC grants (nothing here), a
// compaction turns an old resourceVersion into 410 Gone, and the
// kubeconfig and kubectl reach the same server.
func TestServer(t *testing.T) {
	s := kubeapi.Start(t, kubeapi.WithoutWatchCache())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := s.Clientset(t)

	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != kubeapi.Version {
		t.Fatalf("server version %q, want %q", v.GitVersion, kubeapi.Version)
	}

	cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	sa, err := kubernetes.NewForConfig(s.ServiceAccountConfig(t, "probe-ns", "probe-sa"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = sa.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a ServiceAccount without RBAC read a ConfigMap: err = %v", err)
	}

	old := cm.ResourceVersion
	if _, err := cs.CoreV1().ConfigMaps("default").Update(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", ResourceVersion: old}, Data: map[string]string{"k": "w"},
	}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Compact(t)
	// Without the watch cache a list at an exact RV is read from etcd,
	// which must report the compaction.
	_, err = cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{ResourceVersion: old, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Fatalf("list at compacted RV %s: err = %v, want 410", old, err)
	}

	out, err := exec.CommandContext(ctx, kubeapi.Kubectl(t), "--kubeconfig", s.Kubeconfig, "get", "configmap", "probe", "-o", "jsonpath={.data.k}").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl: %v: %s", err, out)
	}
	if strings.TrimSpace(string(out)) != "w" {
		t.Fatalf("kubectl read %q, want w", out)
	}
}
