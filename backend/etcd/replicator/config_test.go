package replicator

import (
	"reflect"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestParsePeer(t *testing.T) {
	ok := []struct {
		spec string
		want Peer
	}{
		{"eu-west=10.0.0.1:2379", Peer{"eu-west", []string{"10.0.0.1:2379"}}},
		{"b=http://etcd-0:2379,https://etcd-1:2379", Peer{"b", []string{"http://etcd-0:2379", "https://etcd-1:2379"}}},
		{" b = etcd-0:2379 , etcd-1:2379 ", Peer{"b", []string{"etcd-0:2379", "etcd-1:2379"}}},
		{"us.east-1=[::1]:2379", Peer{"us.east-1", []string{"[::1]:2379"}}},
		{"b=http://etcd:2379/", Peer{"b", []string{"http://etcd:2379/"}}},
	}
	for _, c := range ok {
		got, err := ParsePeer(c.spec)
		if err != nil {
			t.Errorf("ParsePeer(%q): %v", c.spec, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParsePeer(%q) = %+v, want %+v", c.spec, got, c.want)
		}
	}

	bad := []struct{ spec, wantErr string }{
		{"", "want region=endpoint"},
		{"b", "want region=endpoint"},
		{"etcd-0:2379", "want region=endpoint"},
		{"=etcd:2379", "region must not be empty"},
		{"b/c=etcd:2379", "must not contain '/'"},
		{"b c=etcd:2379", "contains \" \""},
		{"-b=etcd:2379", "must start and end with a letter or digit"},
		{"b=", "region b has no endpoints"},
		{"b=  ", "region b has no endpoints"},
		{"b=etcd:1,,etcd:2", "endpoint 2 is empty"},
		{"b=etcd:1,", "endpoint 2 is empty"},
		{"b=etcd", "not host:port (missing port in address)"},
		{"b=:2379", "empty host"},
		{"b=etcd:", "empty port"},
		{"b=ftp://etcd:2379", "scheme \"ftp\"; use http:// or https://"},
		{"b=unix://etcd:2379", "scheme \"unix\""},
		{"b=http://etcd:2379/v3", "want scheme://host:port and nothing else"},
		{"b=http://user@etcd:2379", "want scheme://host:port and nothing else"},
		{"b=http://etcd", "not host:port"},
		{"b=etcd:1,etcd:1", "endpoint \"etcd:1\" is given twice"},
	}
	for _, c := range bad {
		_, err := ParsePeer(c.spec)
		if err == nil {
			t.Errorf("ParsePeer(%q) succeeded, want an error containing %q", c.spec, c.wantErr)
			continue
		}
		if !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("ParsePeer(%q) = %q, want it to contain %q", c.spec, err, c.wantErr)
		}
		if !strings.Contains(err.Error(), "--peer-etcd") {
			t.Errorf("ParsePeer(%q) = %q: should name the flag", c.spec, err)
		}
	}
}

func TestParsePeers(t *testing.T) {
	peers, err := ParsePeers("a", []string{"b=etcd-b:2379", "c=etcd-c:2379"})
	if err != nil || len(peers) != 2 || peers[0].Region != "b" || peers[1].Region != "c" {
		t.Fatalf("ParsePeers = %+v, %v", peers, err)
	}
	for _, c := range []struct {
		specs   []string
		wantErr string
	}{
		{[]string{"a=etcd:2379"}, "region a is this registrar's own --region"},
		{[]string{"b=etcd-1:2379", "c=x:1", "b=etcd-2:2379"}, `region b was already given by --peer-etcd "b=etcd-1:2379"`},
		{[]string{"b=etcd-1:2379", "c"}, "want region=endpoint"},
	} {
		_, err := ParsePeers("a", c.specs)
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("ParsePeers(%q) = %v, want an error containing %q", c.specs, err, c.wantErr)
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	cli := &clientv3.Client{} // never used: New does not contact etcd
	good := func() Config {
		return Config{Region: "a", Local: cli, Peers: []Peer{{"b", []string{"etcd-b:2379"}}}}
	}
	r, err := New(good())
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg.LeaseTTL != 30*time.Second || r.cfg.SessionTTL != 5*time.Second ||
		r.cfg.ElectionPrefix != "/aether/v1/election/replicator/a" || r.cfg.Identity == "" || r.cfg.MaxTxnOps != 128 {
		t.Errorf("defaults: %+v", r.cfg)
	}
	c := good()
	c.LeaseTTL = 2500 * time.Millisecond
	if r, err := New(c); err != nil || r.cfg.LeaseTTL != 3*time.Second || r.cfg.SessionTTL != 2*time.Second {
		t.Errorf("lease TTL 2.5s: want it rounded up to 3s with session TTL 2s; got %v", err)
	}

	for _, c := range []struct {
		name    string
		mod     func(*Config)
		wantErr string
	}{
		{"bad region", func(c *Config) { c.Region = "a/b" }, "must not contain '/'"},
		{"no local", func(c *Config) { c.Local = nil }, "local etcd client is required"},
		{"no peers", func(c *Config) { c.Peers = nil }, "no peers"},
		{"self peer", func(c *Config) { c.Peers = append(c.Peers, Peer{"a", []string{"x:1"}}) }, "is this region"},
		{"duplicate peer", func(c *Config) { c.Peers = append(c.Peers, Peer{"b", []string{"x:1"}}) }, `"b" is given more than once`},
		{"peer without endpoints", func(c *Config) { c.Peers = []Peer{{Region: "b"}} }, "no endpoints"},
		{"election under root", func(c *Config) { c.ElectionPrefix = "/aether/v1/regions/a/election" }, "must not be"},
		{"election is root", func(c *Config) { c.ElectionPrefix = "/aether/v1/regions" }, "must not be"},
		{"session not below lease", func(c *Config) { c.LeaseTTL, c.SessionTTL = 3*time.Second, 3*time.Second }, "must be below the lease TTL"},
		{"sub-second lease", func(c *Config) { c.LeaseTTL = 500 * time.Millisecond }, "1s granularity"},
	} {
		cfg := good()
		c.mod(&cfg)
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: New = %v, want an error containing %q", c.name, err, c.wantErr)
		}
	}
}

func TestLagBuckets(t *testing.T) {
	var h headTracker
	t0 := time.Unix(1000, 0)
	h.observe(10, t0)
	h.observe(12, t0.Add(50*time.Millisecond)) // same bucket
	h.observe(15, t0.Add(300*time.Millisecond))
	now := t0.Add(time.Second)
	for _, c := range []struct {
		mirrored int64
		want     time.Duration
	}{
		{0, time.Second}, {9, time.Second}, {11, time.Second}, {12, 700 * time.Millisecond}, {14, 700 * time.Millisecond}, {15, 0}, {99, 0},
	} {
		if got := h.lag(c.mirrored, now); got != c.want {
			t.Errorf("lag(%d) = %v, want %v", c.mirrored, got, c.want)
		}
	}
	h.trim(12)
	if got := h.lag(0, now); got != 700*time.Millisecond {
		t.Errorf("after trim: lag(0) = %v, want 700ms", got)
	}
	// Merging keeps the estimate one-sided: never below the true lag.
	var m headTracker
	for i := range maxBuckets + 1 {
		m.observe(int64(i+1), t0.Add(time.Duration(i)*time.Second))
	}
	if len(m.buckets) > maxBuckets {
		t.Fatalf("%d buckets, want at most %d", len(m.buckets), maxBuckets)
	}
	end := t0.Add(time.Duration(maxBuckets+1) * time.Second)
	for rev := int64(0); rev < int64(maxBuckets); rev += 97 {
		trueLag := end.Sub(t0.Add(time.Duration(rev) * time.Second)) // revision rev+1 was seen at t0+rev s
		if got := m.lag(rev, end); got < trueLag {
			t.Fatalf("lag(%d) = %v below the true %v", rev, got, trueLag)
		}
	}
}
