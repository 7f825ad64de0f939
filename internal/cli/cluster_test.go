package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/etcdcluster"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// checkLines are the PASS and FAIL lines of "aether cluster check" text
// output.
func checkLines(stdout string) []string {
	var out []string
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, "PASS ") || strings.HasPrefix(l, "FAIL ") {
			out = append(out, l)
		}
	}
	return out
}

// memberIDs maps member names to their hex IDs, read from etcd itself.
func memberIDs(t *testing.T, c *etcdcluster.Cluster) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := etcdtest.NewClient(t, c.Endpoints()...).MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, m := range resp.Members {
		ids[m.GetName()] = fmt.Sprintf("%x", m.GetID())
	}
	return ids
}

func TestClusterCheckThreeMembers(t *testing.T) {
	t.Parallel()
	c := etcdcluster.Start(t, 3)
	eps := strings.Join(c.Endpoints(), ",")
	ids := memberIDs(t, c)
	peer2, err := url.Parse(c.PeerURLs()[2])
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		lines   []string   // the PASS/FAIL lines, exactly
		wantErr string     // "" for exit 0
		extra   []string   // other text the output must contain
		rows    [][]string // member table rows, by field
	}{
		{
			name: "all voters in distinct sites",
			args: []string{"--site", "m0=zone-1", "--site", "m1=zone-2", "--site", "m2=zone-3"},
			lines: []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"PASS sites: 3 voters in 3 distinct sites",
			},
			extra: []string{": 3 members, 3 voters\n", "NAME  ID"},
			rows: [][]string{
				{"m0", ids["m0"], "voter", "zone-1", c.PeerURLs()[0]},
				{"m1", ids["m1"], "voter", "zone-2", c.PeerURLs()[1]},
				{"m2", ids["m2"], "voter", "zone-3", c.PeerURLs()[2]},
			},
		},
		{
			name: "two voters share a site",
			args: []string{"--site", "m0=zone-1,m1=zone-1", "--site", "m2=zone-2"},
			lines: []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"FAIL sites: voters m0 and m1 share site zone-1; place each voter in its own site",
			},
			wantErr: "etcd cluster fails 1 of 3 seed rules: sites",
		},
		{
			name: "all voters share a site, one has none",
			args: []string{"--site", "m0=zone-1,m2=zone-1"},
			lines: []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"FAIL sites: voters m0 and m2 share site zone-1; place each voter in its own site",
				"FAIL sites: voter m1 has no site; pass --site m1=SITE",
			},
			wantErr: "etcd cluster fails 1 of 3 seed rules: sites",
		},
		{
			name: "no sites at all",
			lines: []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"FAIL sites: voter m0 has no site; pass --site m0=SITE",
				"FAIL sites: voter m1 has no site; pass --site m1=SITE",
				"FAIL sites: voter m2 has no site; pass --site m2=SITE",
			},
			wantErr: "etcd cluster fails 1 of 3 seed rules: sites",
		},
		{
			name: "members by name, hex ID and peer host:port, from the environment",
			env: map[string]string{
				"AETHER_ETCD_ENDPOINTS": eps,
				"AETHER_SITE":           "m0=zone-1," + strings.ToUpper(ids["m1"]) + "=zone-2," + peer2.Host + "=zone-3",
			},
			lines: []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"PASS sites: 3 voters in 3 distinct sites",
			},
		},
		{
			name: "full peer URL and 0x ID; a key that names no member is noted",
			args: []string{"--site", c.PeerURLs()[0] + "=zone-1", "--site", "0x" + ids["m1"] + "=zone-2", "--site", "m2=zone-3", "--site", "m9=zone-9"},
			lines: []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"PASS sites: 3 voters in 3 distinct sites",
			},
			extra: []string{"note: --site m9=zone-9 names no member\n"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"cluster", "check"}
			if tc.env["AETHER_ETCD_ENDPOINTS"] == "" {
				args = append(args, "--etcd-endpoints", eps)
			}
			res := runCLI(t, nil, tc.env, append(args, tc.args...)...)
			switch {
			case tc.wantErr == "" && res.err != nil:
				t.Errorf("error %v, want exit 0", res.err)
			case tc.wantErr != "" && (res.err == nil || res.err.Error() != tc.wantErr):
				t.Errorf("error %v, want %q", res.err, tc.wantErr)
			}
			if got := checkLines(res.stdout); !slices.Equal(got, tc.lines) {
				t.Errorf("check lines:\n%s\nwant:\n%s\nfull output:\n%s", strings.Join(got, "\n"), strings.Join(tc.lines, "\n"), res.stdout)
			}
			for _, row := range tc.rows {
				found := false
				for _, l := range strings.Split(res.stdout, "\n") {
					found = found || slices.Equal(strings.Fields(l), row)
				}
				if !found {
					t.Errorf("member table lacks row %q:\n%s", row, res.stdout)
				}
			}
			for _, want := range tc.extra {
				if !strings.Contains(res.stdout, want) {
					t.Errorf("output lacks %q:\n%s", want, res.stdout)
				}
			}
			if res.stderr != "" {
				t.Errorf("stderr %q", res.stderr)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, nil, "cluster", "check", "--etcd-endpoints", eps, "-o", "json", "--site", "m0=zone-1,m1=zone-1,m2=zone-2")
		if res.err == nil || res.err.Error() != "etcd cluster fails 1 of 3 seed rules: sites" {
			t.Errorf("error %v", res.err)
		}
		var rep struct {
			ClusterID string `json:"cluster_id"`
			Members   []struct {
				Name     string   `json:"name"`
				ID       string   `json:"id"`
				Voter    bool     `json:"voter"`
				Site     string   `json:"site"`
				PeerURLs []string `json:"peer_urls"`
			} `json:"members"`
			Voters int `json:"voters"`
			Checks []struct {
				Rule, Status, Message string
			} `json:"checks"`
			OK *bool `json:"ok"`
		}
		if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
			t.Fatalf("%v\n%s", err, res.stdout)
		}
		if rep.ClusterID == "" || rep.Voters != 3 || len(rep.Members) != 3 || rep.OK == nil || *rep.OK {
			t.Errorf("report:\n%s", res.stdout)
		}
		for i, m := range rep.Members {
			if m.Name != c.Names()[i] || m.ID != ids[m.Name] || !m.Voter || !slices.Equal(m.PeerURLs, []string{c.PeerURLs()[i]}) {
				t.Errorf("member %d: %+v", i, m)
			}
		}
		var got []string
		for _, ch := range rep.Checks {
			got = append(got, ch.Status+" "+ch.Rule+": "+ch.Message)
		}
		want := []string{
			"PASS odd voters: 3 voters; quorum is 2",
			"PASS failover: 3 voters; quorum survives 1 voter down",
			"FAIL sites: voters m0 and m1 share site zone-1; place each voter in its own site",
		}
		if !slices.Equal(got, want) {
			t.Errorf("checks %q\nwant %q", got, want)
		}
	})

	t.Run("one member given two sites", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, nil, "cluster", "check", "--etcd-endpoints", eps, "--site", "m0=zone-1", "--site", ids["m0"]+"=zone-2")
		want := fmt.Sprintf("--site: member m0 is given two sites, zone-2 (as %s) and zone-1 (as m0)", ids["m0"])
		if res.err == nil || res.err.Error() != want {
			t.Errorf("error %v\nwant %s", res.err, want)
		}
		if res.stdout != "" {
			t.Errorf("stdout %q", res.stdout)
		}
	})
}

func TestClusterCheckTwoMembers(t *testing.T) {
	t.Parallel()
	c := etcdcluster.Start(t, 2)
	res := runCLI(t, nil, nil, "cluster", "check", "--etcd-endpoints", c.Endpoints()[1], "--site", "m0=zone-1", "--site", "m1=zone-2")
	want := "etcd cluster fails 2 of 3 seed rules: odd voters, failover"
	if res.err == nil || res.err.Error() != want {
		t.Errorf("error %v\nwant %s", res.err, want)
	}
	wantLines := []string{
		"FAIL odd voters: 2 voters; quorum needs an odd number (add or remove one voter)",
		"FAIL failover: 2 voters; automatic failover needs at least 3",
		"PASS sites: 2 voters in 2 distinct sites",
	}
	if got := checkLines(res.stdout); !slices.Equal(got, wantLines) {
		t.Errorf("check lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
	}
}

func TestClusterCheckUnreachable(t *testing.T) {
	t.Parallel()
	addr := unusedAddr(t)
	start := time.Now()
	res := runCLI(t, nil, nil, "cluster", "check", "--etcd-endpoints", "http://"+addr, "--timeout", "500ms")
	elapsed := time.Since(start)
	if res.err == nil {
		t.Fatalf("no error; stdout %q", res.stdout)
	}
	for _, want := range []string{
		"cannot read the member list from etcd at http://" + addr + " within 500ms: ",
		"check --etcd-endpoints (or AETHER_ETCD_ENDPOINTS)",
	} {
		if !strings.Contains(res.err.Error(), want) {
			t.Errorf("error %q\nwant it to contain %q", res.err, want)
		}
	}
	if elapsed > 5*time.Second {
		t.Errorf("took %s with --timeout 500ms", elapsed)
	}
	if res.stdout != "" || res.stderr != "" {
		t.Errorf("output on error: stdout %q, stderr %q", res.stdout, res.stderr)
	}
}

// TestClusterCheckFlagErrors checks that bad flags fail before etcd is
// contacted.
func TestClusterCheckFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no endpoints", nil, []string{}, "--etcd-endpoints is required: give the etcd client URLs, e.g. --etcd-endpoints http://etcd-a:2379,http://etcd-b:2379,http://etcd-c:2379 (or set AETHER_ETCD_ENDPOINTS)"},
		{"empty endpoint", nil, []string{"--etcd-endpoints", "SENTINEL,"}, "--etcd-endpoints: entry 2 is empty"},
		{"site without =", nil, []string{"--site", "m0"}, `--site "m0": expected MEMBER=SITE`},
		{"site without member", nil, []string{"--site", "=zone-1"}, `--site "=zone-1": expected MEMBER=SITE`},
		{"empty site", nil, []string{"--site", "m0="}, `--site "m0=": site must not be empty`},
		{"bad site", nil, []string{"--site", "m0=zone 1"}, `--site "m0=zone 1": site "zone 1" contains " "`},
		{"member twice", nil, []string{"--site", "m0=a,m0=b"}, `--site "m0=b": member "m0" is given more than once`},
		{"bad output", nil, []string{"-o", "yaml"}, `-o/--output "yaml": use text or json`},
		{"zero timeout", nil, []string{"--timeout", "0s"}, "--timeout 0s: must be positive"},
		{"env site", map[string]string{"AETHER_SITE": "m0"}, nil, `--site "m0": expected MEMBER=SITE`},
		{"positional argument", nil, []string{"m0"}, `unknown command "m0" for "aether cluster check"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSentinel(t)
			// Defaults first, so the case's own flags win.
			args := []string{"cluster", "check", "--timeout", "2s"}
			if tc.name != "no endpoints" && !slices.Contains(tc.args, "--etcd-endpoints") {
				args = append(args, "--etcd-endpoints", "http://"+s.addr())
			}
			for _, a := range tc.args {
				args = append(args, strings.ReplaceAll(a, "SENTINEL", "http://"+s.addr()))
			}
			res := runCLI(t, nil, tc.env, args...)
			if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", res.err, tc.want)
			}
			if n := s.conns.Load(); n != 0 {
				t.Errorf("%d connection(s) to etcd; flags must be checked first", n)
			}
			if res.stdout != "" || res.stderr != "" {
				t.Errorf("output on error: stdout %q, stderr %q", res.stdout, res.stderr)
			}
		})
	}
}

// TestCheckCluster covers member lists a test cluster does not easily
// produce: learners, members added but not started, larger clusters.
func TestCheckCluster(t *testing.T) {
	t.Parallel()
	voter := func(name string, id uint64) etcdMember {
		return etcdMember{Name: name, ID: id, PeerURLs: []string{fmt.Sprintf("http://10.0.0.%d:2380", id)}}
	}
	learner := func(name string, id uint64) etcdMember {
		m := voter(name, id)
		m.Learner = true
		return m
	}
	tests := []struct {
		name    string
		members []etcdMember
		sites   map[string]string
		want    []string
	}{
		{"one voter", []etcdMember{voter("a", 1)}, map[string]string{"a": "s1"}, []string{
			"PASS odd voters: 1 voter; quorum is 1",
			"FAIL failover: 1 voter; automatic failover needs at least 3",
			"PASS sites: 1 voter in 1 distinct site",
		}},
		{"learner not counted and needs no site", []etcdMember{voter("a", 1), voter("b", 2), voter("c", 3), learner("d", 4)},
			map[string]string{"a": "s1", "b": "s2", "c": "s3"}, []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"PASS sites: 3 voters in 3 distinct sites",
			}},
		{"member not started yet counts as a voter", []etcdMember{voter("a", 1), voter("b", 2), voter("c", 3), {ID: 0xabc, PeerURLs: []string{"http://10.0.0.9:2380"}}},
			map[string]string{"a": "s1", "b": "s2", "c": "s3"}, []string{
				"FAIL odd voters: 4 voters; quorum needs an odd number (add or remove one voter)",
				"PASS failover: 4 voters; quorum survives 1 voter down",
				"FAIL sites: voter abc has no site; pass --site abc=SITE",
			}},
		{"not-started member by peer host:port", []etcdMember{voter("a", 1), voter("b", 2), {ID: 0xabc, PeerURLs: []string{"http://10.0.0.9:2380"}}},
			map[string]string{"a": "s1", "b": "s2", "10.0.0.9:2380": "s3"}, []string{
				"PASS odd voters: 3 voters; quorum is 2",
				"PASS failover: 3 voters; quorum survives 1 voter down",
				"PASS sites: 3 voters in 3 distinct sites",
			}},
		{"five voters, three in one site", []etcdMember{voter("e", 5), voter("d", 4), voter("c", 3), voter("b", 2), voter("a", 1)},
			map[string]string{"a": "s1", "b": "s1", "c": "s1", "d": "s2", "e": "s2"}, []string{
				"PASS odd voters: 5 voters; quorum is 3",
				"PASS failover: 5 voters; quorum survives 2 voters down",
				"FAIL sites: voters a, b and c share site s1; place each voter in its own site",
				"FAIL sites: voters d and e share site s2; place each voter in its own site",
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rep, err := checkCluster(tc.members, tc.sites)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range rep.Checks {
				got = append(got, c.Status+" "+c.Rule+": "+c.Message)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if rep.OK != !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "FAIL") }) {
				t.Errorf("ok = %v", rep.OK)
			}
		})
	}

	// A key that names two members is refused.
	_, err := checkCluster([]etcdMember{voter("2", 1), voter("b", 2)}, map[string]string{"2": "s1"})
	if err == nil || !strings.Contains(err.Error(), `"2" names more than one member: 2 (ID 1) and b (ID 2); use the member ID instead`) {
		t.Errorf("ambiguous key: %v", err)
	}
}
