package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/aethermesh/aether/server"
)

// kubeReport is a kubernetes section's figures at sizes 1k and 10k, the
// kubernetes backend's peer-watch-off row at 10k given by kube10k.
func kubeReport(kube10k KubeRun) Report {
	api := &APIServerStats{CPUCores: 0.2, PeakCPUCores: 0.4, RSSMiB: 300, PeakRSSMiB: 320}
	fine := func(n int) KubeRun {
		return KubeRun{Backend: server.BackendKubernetes, Endpoints: n, AckPS: 5000, VisiblePS: 400,
			Propagation: CrossReplicaResult{BatchInterval: "100ms", Cross: Latencies{N: 10, P50: 20, P99: 80, Max: 90}}, LoadAPI: api, PropAPI: api}
	}
	etcd := func(n int, pw bool) KubeRun {
		return KubeRun{Backend: server.BackendEtcd, PeerWatch: pw, Endpoints: n, AckPS: 9000, VisiblePS: 9000,
			Propagation: CrossReplicaResult{BatchInterval: "10ms", Cross: Latencies{N: 10, P50: 5, P99: 12, Max: 15}}}
	}
	on := func(n int) KubeRun { r := fine(n); r.PeerWatch = true; return r }
	kube10k.Backend, kube10k.Endpoints = server.BackendKubernetes, 10000
	return Report{Date: "d", Machine: "m", Command: "c", Kubernetes: &KubernetesResult{Sizes: []int{1000, 10000}, Changes: 10, Rate: 100, Runs: []KubeRun{
		etcd(1000, false), etcd(1000, true), fine(1000), on(1000),
		etcd(10000, false), etcd(10000, true), kube10k, on(10000),
	}}}
}

// TestKubernetesSection: the section has its marks, a row per run with the
// API server's figures only on kubernetes rows, and says where the backend
// stops being fine: at the first size whose peer-watch-off run persists
// under the propagation rate, or whose p99 or API-server CPU is past the
// line; else that it is fine up to the largest size.
func TestKubernetesSection(t *testing.T) {
	base := kubeReport(KubeRun{}).Kubernetes.Runs[2] // a fine kubernetes row
	slow, p99, cpu := base, base, base
	slow.VisiblePS = 40
	p99.Propagation.Cross.P99 = 2500
	cpu.PropAPI = &APIServerStats{CPUCores: 0.9, PeakCPUCores: 1.6}
	for _, tc := range []struct {
		name string
		run  KubeRun
		want string
	}{
		{"fine", base, "**Fine up to the largest size measured, 10000 endpoints**"},
		{"slow", slow, "**Where it stops being fine: 10000 endpoints** (it persisted and watched back 40 registrations/s, under the 100/s"},
		{"p99", p99, "**Where it stops being fine: 10000 endpoints** (cross-replica p99 2500 ms > 1s"},
		{"cpu", cpu, "**Where it stops being fine: 10000 endpoints** (the API server's busiest second at 1.60 cores"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := kubeReport(tc.run).Markdown()
			if !strings.HasPrefix(md, kubeBeginMark+"\n### Kubernetes backend (last run d)") || !strings.HasSuffix(md, kubeEndMark+"\n") {
				t.Fatalf("section lacks its marks or title:\n%s", md)
			}
			for _, row := range []string{
				"| 1000 | etcd | off | 10ms | 9000/s | 9000/s | 5.00 ms | 12.00 ms | 15.00 ms | — | — |",
				"| 1000 | kubernetes | on | 100ms | 5000/s | 400/s | 20.00 ms | 80.00 ms | 90.00 ms | 0.20 (0.40) / 0.20 (0.40) | 300 MiB (320) |",
			} {
				if !strings.Contains(md, row) {
					t.Errorf("no row %q in\n%s", row, md)
				}
			}
			if !strings.Contains(md, tc.want) {
				t.Errorf("want %q in\n%s", tc.want, md)
			}
			if strings.Count(md, "stops being fine")+strings.Count(md, "Fine up to") != 1 {
				t.Errorf("want exactly one verdict in\n%s", md)
			}
		})
	}
}

// TestKubernetesSectionSmallest: a line crossed at the smallest size is
// said to be crossed already there.
func TestKubernetesSectionSmallest(t *testing.T) {
	r := kubeReport(kubeReport(KubeRun{}).Kubernetes.Runs[2])
	r.Kubernetes.Runs[2].VisiblePS = 40
	if md := r.Markdown(); !strings.Contains(md, "**Where it stops being fine: already at 1000 endpoints, the smallest size measured**") {
		t.Errorf("1k persisting 40/s: no verdict at the smallest size in\n%s", md)
	}
}

// TestKubernetesSectionInFile: UpdateFile puts the section in, and a
// second run replaces it rather than adding another.
func TestKubernetesSectionInFile(t *testing.T) {
	path := t.TempDir() + "/benchmarks.md"
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nintro\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := kubeReport(KubeRun{})
	for range 2 {
		if err := r.UpdateFile(path); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if doc := string(b); strings.Count(doc, kubeBeginMark) != 1 || !strings.HasPrefix(doc, "# Benchmarks\n\nintro\n") {
		t.Errorf("document after two updates:\n%s", doc)
	}
}

// TestCPUSampler: the sampler reads a live process (this one): memory
// figures present, and CPU never negative.
func TestCPUSampler(t *testing.T) {
	s := sampleCPU(os.Getpid())
	x := 0
	for i := range 20_000_000 { // some CPU for the sampler to see
		x += i
	}
	_ = x
	st := s.done()
	if st.RSSMiB <= 0 || st.PeakRSSMiB < st.RSSMiB || st.CPUCores < 0 || st.PeakCPUCores < st.CPUCores {
		t.Errorf("sampler figures %+v", st)
	}
}
