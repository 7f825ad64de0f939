package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/registry"
)

func newClusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Inspect the etcd cluster the registrars use",
		Long: `Inspect the etcd cluster the registrars use.

"aether cluster check" checks the member list against the seed rules of an
appliance mesh.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newClusterCheckCmd())
	return cmd
}

// The seed rules "aether cluster check" applies, by the names it reports.
const (
	ruleOdd      = "odd voters"
	ruleFailover = "failover"
	ruleSites    = "sites"
)

func newClusterCheckCmd() *cobra.Command {
	var endpoints, sites []string
	var timeout time.Duration
	var output string
	var etcdTLS etcdTLSFlags
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check etcd membership against the seed rules",
		Long: `Check the etcd cluster's members against the seed rules of an appliance
mesh, and report each rule as PASS or FAIL with the reason:

  odd voters  quorum needs an odd number of voters: an even number tolerates
              no more failures than one voter fewer, and can split in half
  failover    at least 3 voters, so that quorum survives losing one
  sites       every voter in a site of its own, so that one site going
              down takes at most one voter with it

Voters are the members that are not learners; learners are listed but not
counted. Sites are given with --site MEMBER=SITE, once per member, where
MEMBER is the member's name, its ID in hex (as shown by this command and by
etcdctl member list), or its peer host:port.

The command exits non-zero if any rule fails.`,
		Example: `  aether cluster check --etcd-endpoints http://etcd-a:2379,http://etcd-b:2379,http://etcd-c:2379 \
      --site etcd-a=zone-1 --site etcd-b=zone-2 --site etcd-c=zone-3
  AETHER_ETCD_ENDPOINTS=http://etcd-a:2379 AETHER_SITE=etcd-a=zone-1,etcd-b=zone-2,etcd-c=zone-3 aether cluster check -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "text", "json"); err != nil {
				return err
			}
			eps, err := checkEtcdEndpoints(endpoints)
			if err != nil {
				return err
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: must be positive (e.g. 5s)", timeout)
			}
			siteOf, err := parseSites(sites)
			if err != nil {
				return err
			}
			tlsCfg, err := etcdTLS.config(eps)
			if err != nil {
				return err
			}
			members, clusterID, err := listEtcdMembers(cmd.Context(), eps, tlsCfg, timeout)
			if err != nil {
				return err
			}
			rep, err := checkCluster(members, siteOf)
			if err != nil {
				return err
			}
			rep.ClusterID = clusterID
			if output == "json" {
				err = writeClusterJSON(cmd.OutOrStdout(), rep)
			} else {
				err = writeClusterText(cmd.OutOrStdout(), rep)
			}
			if err != nil {
				return err
			}
			if failed := rep.failedRules(); len(failed) > 0 {
				return fmt.Errorf("etcd cluster fails %d of 3 seed rules: %s", len(failed), strings.Join(failed, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&endpoints, "etcd-endpoints", nil, "etcd client URLs, comma-separated (required)")
	f.StringSliceVar(&sites, "site", nil, "MEMBER=SITE: the site of a member (name, hex ID or peer host:port); repeatable or comma-separated")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for etcd to answer")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	etcdTLS.add(f)
	return cmd
}

// checkEtcdEndpoints checks --etcd-endpoints and returns it trimmed.
func checkEtcdEndpoints(endpoints []string) ([]string, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("--etcd-endpoints is required: give the etcd client URLs, e.g. --etcd-endpoints http://etcd-a:2379,http://etcd-b:2379,http://etcd-c:2379 (or set AETHER_ETCD_ENDPOINTS)")
	}
	out := make([]string, len(endpoints))
	for i, ep := range endpoints {
		out[i] = strings.TrimSpace(ep)
		if out[i] == "" {
			return nil, fmt.Errorf("--etcd-endpoints: entry %d is empty; give comma-separated URLs such as http://etcd-0:2379", i+1)
		}
	}
	return out, nil
}

// parseSites parses --site MEMBER=SITE values into a map from member key to
// site. The site is the part after the last '=' (a site name cannot contain
// one), so a member key may.
func parseSites(values []string) (map[string]string, error) {
	siteOf := make(map[string]string, len(values))
	for _, v := range values {
		i := strings.LastIndexByte(v, '=')
		if i <= 0 {
			return nil, fmt.Errorf("--site %q: expected MEMBER=SITE, MEMBER being a member name, hex member ID or peer host:port", v)
		}
		key, site := strings.TrimSpace(v[:i]), v[i+1:]
		if key == "" {
			return nil, fmt.Errorf("--site %q: expected MEMBER=SITE, MEMBER being a member name, hex member ID or peer host:port", v)
		}
		if err := registry.ValidateName("site", site); err != nil {
			return nil, fmt.Errorf("--site %q: %v", v, err)
		}
		if _, dup := siteOf[key]; dup {
			return nil, fmt.Errorf("--site %q: member %q is given more than once", v, key)
		}
		siteOf[key] = site
	}
	return siteOf, nil
}

// etcdMember is what the check needs of an etcd member.
type etcdMember struct {
	Name       string
	ID         uint64
	PeerURLs   []string
	ClientURLs []string
	Learner    bool
}

// label is how messages name the member: its name, or for a member that was
// added but has not started yet (it has no name), its hex ID.
func (m etcdMember) label() string {
	if m.Name != "" {
		return m.Name
	}
	return memberIDString(m.ID)
}

// memberIDString formats a member ID as etcd and etcdctl do.
func memberIDString(id uint64) string { return strconv.FormatUint(id, 16) }

// matches reports whether a --site key names the member: by name, by hex ID
// (optionally 0x-prefixed, any case), or by a peer URL or its host:port.
func (m etcdMember) matches(key string) bool {
	if m.Name != "" && key == m.Name {
		return true
	}
	hex := strings.TrimPrefix(strings.ToLower(key), "0x")
	if id, err := strconv.ParseUint(hex, 16, 64); err == nil && id == m.ID {
		return true
	}
	for _, p := range m.PeerURLs {
		if key == p {
			return true
		}
		if u, err := url.Parse(p); err == nil && u.Host != "" && key == u.Host {
			return true
		}
	}
	return false
}

// listEtcdMembers reads the member list, linearizably: it is the membership
// the cluster agreed on, not one member's view.
func listEtcdMembers(ctx context.Context, endpoints []string, tlsCfg *tls.Config, timeout time.Duration) ([]etcdMember, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	where := strings.Join(endpoints, ",")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         tlsCfg,
		DialTimeout: timeout,
		Context:     ctx,
		// The client logs each retry; the error below says what matters.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, "", fmt.Errorf("--etcd-endpoints %s: %v", where, err)
	}
	defer cli.Close()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		if ctx.Err() != nil || status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded {
			if cause := context.Cause(ctx); errors.Is(cause, context.Canceled) {
				return nil, "", fmt.Errorf("read etcd member list: %w", cause)
			}
			return nil, "", fmt.Errorf("cannot read the member list from etcd at %s within %s: %v; check --etcd-endpoints (or AETHER_ETCD_ENDPOINTS), and that the cluster has quorum (raise --timeout if it is slow)",
				where, timeout, errorMessage(err))
		}
		return nil, "", fmt.Errorf("read the member list from etcd at %s: %v", where, errorMessage(err))
	}
	members := make([]etcdMember, 0, len(resp.Members))
	for _, m := range resp.Members {
		members = append(members, etcdMember{
			Name:       m.GetName(),
			ID:         m.GetID(),
			PeerURLs:   m.GetPeerURLs(),
			ClientURLs: m.GetClientURLs(),
			Learner:    m.GetIsLearner(),
		})
	}
	return members, memberIDString(resp.Header.GetClusterId()), nil
}

// errorMessage is a gRPC error's message without the "rpc error: code = ..."
// prefix.
func errorMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// clusterReport is the result of "aether cluster check"; -o json prints it.
// Its field names are a stable interface for scripts.
type clusterReport struct {
	ClusterID string         `json:"cluster_id"`
	Members   []memberReport `json:"members"`
	Voters    int            `json:"voters"`
	Learners  int            `json:"learners"`
	Checks    []checkResult  `json:"checks"`
	Unmatched []string       `json:"unmatched_sites,omitempty"` // --site values that name no member
	OK        bool           `json:"ok"`
}

type memberReport struct {
	Name       string   `json:"name"`
	ID         string   `json:"id"`
	Voter      bool     `json:"voter"`
	Site       string   `json:"site,omitempty"`
	PeerURLs   []string `json:"peer_urls"`
	ClientURLs []string `json:"client_urls"`
}

// checkResult is one finding: a rule passes with one result, and may fail
// with several (one per pair of voters sharing a site, say).
type checkResult struct {
	Rule    string `json:"rule"`
	Status  string `json:"status"` // PASS or FAIL
	Message string `json:"message"`
}

func (r *clusterReport) add(rule string, pass bool, format string, args ...any) {
	st := "FAIL"
	if pass {
		st = "PASS"
	}
	r.Checks = append(r.Checks, checkResult{Rule: rule, Status: st, Message: fmt.Sprintf(format, args...)})
}

// failedRules lists the rules with at least one FAIL, in check order.
func (r *clusterReport) failedRules() []string {
	var failed []string
	for _, c := range r.Checks {
		if c.Status == "FAIL" && !slices.Contains(failed, c.Rule) {
			failed = append(failed, c.Rule)
		}
	}
	return failed
}

// checkCluster applies the seed rules to a member list, with sites given by
// --site keys. It fails only for inconsistent --site values (one member
// given two different sites, or a key naming two members).
func checkCluster(members []etcdMember, siteOf map[string]string) (*clusterReport, error) {
	members = slices.Clone(members)
	slices.SortFunc(members, func(a, b etcdMember) int {
		// Started members by name, then members not started yet by ID.
		if (a.Name == "") != (b.Name == "") {
			if a.Name == "" {
				return 1
			}
			return -1
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return cmpUint(a.ID, b.ID)
	})

	// Resolve --site keys to members.
	site := make([]string, len(members))
	via := make([]string, len(members)) // the key that gave the site
	rep := &clusterReport{Members: []memberReport{}, Checks: []checkResult{}}
	keys := make([]string, 0, len(siteOf))
	for k := range siteOf {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		var hits []int
		for i, m := range members {
			if m.matches(key) {
				hits = append(hits, i)
			}
		}
		switch {
		case len(hits) == 0:
			rep.Unmatched = append(rep.Unmatched, key+"="+siteOf[key])
			continue
		case len(hits) > 1:
			return nil, fmt.Errorf("--site %s=%s: %q names more than one member: %s and %s; use the member ID instead",
				key, siteOf[key], key, members[hits[0]].describe(), members[hits[1]].describe())
		}
		i := hits[0]
		if site[i] != "" && site[i] != siteOf[key] {
			return nil, fmt.Errorf("--site: member %s is given two sites, %s (as %s) and %s (as %s)",
				members[i].label(), site[i], via[i], siteOf[key], key)
		}
		site[i], via[i] = siteOf[key], key
	}

	var voters []int
	for i, m := range members {
		rep.Members = append(rep.Members, memberReport{
			Name:       m.Name,
			ID:         memberIDString(m.ID),
			Voter:      !m.Learner,
			Site:       site[i],
			PeerURLs:   nonNil(m.PeerURLs),
			ClientURLs: nonNil(m.ClientURLs),
		})
		if m.Learner {
			rep.Learners++
		} else {
			voters = append(voters, i)
		}
	}
	n := len(voters)
	rep.Voters = n

	if n%2 == 1 {
		rep.add(ruleOdd, true, "%s; quorum is %d", plural(n, "voter"), n/2+1)
	} else {
		rep.add(ruleOdd, false, "%s; quorum needs an odd number (add or remove one voter)", plural(n, "voter"))
	}

	if n >= 3 {
		rep.add(ruleFailover, true, "%s; quorum survives %s down", plural(n, "voter"), plural((n-1)/2, "voter"))
	} else {
		rep.add(ruleFailover, false, "%s; automatic failover needs at least 3", plural(n, "voter"))
	}

	bySite := map[string][]string{}
	var siteNames, missing []string
	for _, i := range voters {
		label := members[i].label()
		if site[i] == "" {
			missing = append(missing, label)
			continue
		}
		if _, seen := bySite[site[i]]; !seen {
			siteNames = append(siteNames, site[i])
		}
		bySite[site[i]] = append(bySite[site[i]], label)
	}
	slices.Sort(siteNames)
	sitesOK := true
	for _, s := range siteNames {
		if vs := bySite[s]; len(vs) > 1 {
			sitesOK = false
			rep.add(ruleSites, false, "voters %s share site %s; place each voter in its own site", joinAnd(vs), s)
		}
	}
	for _, label := range missing {
		sitesOK = false
		rep.add(ruleSites, false, "voter %s has no site; pass --site %s=SITE", label, label)
	}
	if sitesOK {
		rep.add(ruleSites, true, "%s in %s", plural(n, "voter"), plural(len(siteNames), "distinct site"))
	}
	rep.OK = len(rep.failedRules()) == 0
	return rep, nil
}

// describe names a member with its ID, for messages about ambiguity.
func (m etcdMember) describe() string {
	if m.Name == "" {
		return "ID " + memberIDString(m.ID)
	}
	return m.Name + " (ID " + memberIDString(m.ID) + ")"
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// plural is "1 voter" or "3 voters".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// joinAnd joins names as "a and b" or "a, b and c".
func joinAnd(names []string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// writeClusterText prints the member table, then one PASS or FAIL line per
// finding.
func writeClusterText(w io.Writer, rep *clusterReport) error {
	learners := ""
	if rep.Learners > 0 {
		learners = fmt.Sprintf(", %s (not counted)", plural(rep.Learners, "learner"))
	}
	fmt.Fprintf(w, "etcd cluster %s: %s, %s%s\n", rep.ClusterID, plural(len(rep.Members), "member"), plural(rep.Voters, "voter"), learners)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tROLE\tSITE\tPEER URLS")
	for _, m := range rep.Members {
		role := "voter"
		if !m.Voter {
			role = "learner"
		}
		name := m.Name
		if name == "" {
			name = "(not started)"
		}
		peers := strings.Join(m.PeerURLs, ",")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, m.ID, role, orDash(m.Site), orDash(peers))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, u := range rep.Unmatched {
		fmt.Fprintf(w, "note: --site %s names no member\n", u)
	}
	fmt.Fprintln(w)
	for _, c := range rep.Checks {
		fmt.Fprintf(w, "%s %s: %s\n", c.Status, c.Rule, c.Message)
	}
	return nil
}

// writeClusterJSON prints the report as one indented JSON document.
func writeClusterJSON(w io.Writer, rep *clusterReport) error {
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	out = append(out, '\n')
	_, err = w.Write(out)
	return err
}
