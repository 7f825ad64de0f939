package cli

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/etcd/migrate"
	"github.com/aethermesh/aether/backend/etcd/replicator"
	"github.com/aethermesh/aether/registry"
)

// inspectPageSize bounds one Range of aether inspect; pages are read at one
// pinned revision, so the listing is a consistent snapshot however large.
const inspectPageSize = 500

// Kinds of key aether inspect tells apart, by the key's shape.
const (
	kindEndpoint  = "endpoint"
	kindNode      = "node"
	kindTombstone = "tombstone"
	kindFence     = "fence"
	kindHome      = "home"
	kindElection  = "election"
	kindLegacy    = "legacy"
	kindUnknown   = "unknown"
)

// inspectedKey is one key as aether inspect prints it (-o json: a stable
// interface for scripts). Value is the decoded value (protobuf as protojson
// with proto field names, text as a string); a value that does not decode
// has Error set and Raw (hex) instead.
type inspectedKey struct {
	Key         string          `json:"key"`
	Kind        string          `json:"kind"`
	Region      string          `json:"region,omitempty"`
	Cluster     string          `json:"cluster,omitempty"`
	Service     string          `json:"service,omitempty"`
	Node        string          `json:"node,omitempty"`
	ModRevision int64           `json:"mod_revision"`
	Lease       string          `json:"lease,omitempty"` // hex, as etcdctl prints it
	TTLSeconds  *int64          `json:"ttl_seconds,omitempty"`
	GrantedTTL  *int64          `json:"granted_ttl_seconds,omitempty"`
	LeaseGone   bool            `json:"lease_expired,omitempty"`
	Mirrored    bool            `json:"mirrored,omitempty"` // a foreign region's key, mirrored in by its replicator
	Value       json.RawMessage `json:"value,omitempty"`
	Summary     string          `json:"summary"`
	Error       string          `json:"error,omitempty"`
	Raw         string          `json:"raw_hex,omitempty"`

	lease int64
}

// inspectJSON is the document aether inspect -o json prints.
type inspectJSON struct {
	Revision int64           `json:"revision"`
	Prefix   string          `json:"prefix"`
	Keys     []*inspectedKey `json:"keys"`
}

type inspectFilter struct {
	prefix, service, region, kind string
}

func newInspectCmd() *cobra.Command {
	var (
		endpoints []string
		timeout   time.Duration
		etcdTLS   etcdTLSFlags
		output    string
		flt       inspectFilter
	)
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Read Aether's keys straight from etcd and print them decoded",
		Long: `Read Aether's keys straight from an etcd cluster, without a registrar,
and print them decoded: endpoints and node records (binary protobuf in etcd;
"etcdctl get" shows raw bytes), tombstones, the replicator's fence, home and
election keys, legacy keys. Each key shows its lease and the lease's remaining
TTL; a foreign region's keys mirrored in by its replicator are marked. A value
that does not decode is shown as such (with its bytes in hex), not fatal.

The keys are read at one revision, in pages, so the listing is a consistent
snapshot of the store.`,
		Example: `  aether inspect --etcd-endpoints http://10.0.0.1:2379
  aether inspect --etcd-endpoints http://10.0.0.1:2379 --region us --service web
  aether inspect --etcd-endpoints https://10.0.0.1:2379 --etcd-cacert ca.pem \
      --etcd-cert operator.pem --etcd-key operator-key.pem -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			if len(endpoints) == 0 {
				return errors.New("--etcd-endpoints is required: the etcd cluster to read (e.g. --etcd-endpoints http://127.0.0.1:2379)")
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: must be positive", timeout)
			}
			if flt.region != "" {
				if err := registry.ValidateName("region", flt.region); err != nil {
					return fmt.Errorf("--region: %w", err)
				}
			}
			if flt.service != "" {
				if err := registry.ValidateName("service", flt.service); err != nil {
					return fmt.Errorf("--service: %w", err)
				}
			}
			if flt.kind != "" && !validKind(flt.kind) {
				return fmt.Errorf("--kind %q: use one of %s", flt.kind, strings.Join(allKinds, ", "))
			}
			tlsCfg, err := etcdTLS.config(endpoints)
			if err != nil {
				return err
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tlsCfg, DialTimeout: timeout, Logger: zap.NewNop()})
			if err != nil {
				return fmt.Errorf("--etcd-endpoints %v: %w", endpoints, err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rev, keys, err := inspectKeys(ctx, cli, flt)
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("etcd at %v did not answer within %s (check --etcd-endpoints and the --etcd-cacert/--etcd-cert/--etcd-key flags, or raise --timeout): %w", endpoints, timeout, err)
				}
				return fmt.Errorf("inspect etcd at %v: %w", endpoints, err)
			}
			if output == "json" {
				return writeInspectJSON(cmd.OutOrStdout(), rev, flt.prefix, keys)
			}
			return writeInspectTable(cmd.OutOrStdout(), rev, keys)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&endpoints, "etcd-endpoints", nil, "etcd cluster, comma separated (required)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "bound on the whole read")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.StringVar(&flt.prefix, "prefix", "/aether/", "read only keys under this prefix")
	f.StringVar(&flt.service, "service", "", "only this service's endpoint keys and tombstones")
	f.StringVar(&flt.region, "region", "", "only this region's keys (its subtree, tombstones and replication keys)")
	f.StringVar(&flt.kind, "kind", "", "only keys of this kind: "+strings.Join(allKinds, ", "))
	etcdTLS.add(f)
	return cmd
}

var allKinds = []string{kindEndpoint, kindNode, kindTombstone, kindFence, kindHome, kindElection, kindLegacy, kindUnknown}

func validKind(k string) bool {
	for _, a := range allKinds {
		if a == k {
			return true
		}
	}
	return false
}

// inspectKeys reads every key under flt.prefix at one revision, decodes
// it, filters it and looks up each distinct lease once.
func inspectKeys(ctx context.Context, cli *clientv3.Client, flt inspectFilter) (int64, []*inspectedKey, error) {
	prefix := flt.prefix
	if prefix == "" {
		return 0, nil, errors.New("--prefix is empty: that would read the whole etcd keyspace; give a prefix such as /aether/")
	}
	var rev int64
	var out []*inspectedKey
	fences := map[string]bool{} // regions whose replicator fenced this etcd: their keys here are mirrored in
	key := prefix
	end := clientv3.GetPrefixRangeEnd(prefix)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(inspectPageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, key, opts...)
		if err != nil {
			return 0, nil, fmt.Errorf("range %s: %w", key, err)
		}
		if rev == 0 {
			rev = resp.Header.GetRevision()
		}
		for _, kv := range resp.Kvs {
			k := decodeKey(string(kv.Key), kv.Value)
			k.ModRevision, k.lease = kv.ModRevision, kv.Lease
			if k.Kind == kindFence {
				fences[k.Region] = true
			}
			out = append(out, k)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	kept := out[:0]
	for _, k := range out {
		if (k.Kind == kindEndpoint || k.Kind == kindNode) && fences[k.Region] {
			k.Mirrored = true
		}
		if flt.keep(k) {
			kept = append(kept, k)
		}
	}
	if err := attachLeases(ctx, cli, kept); err != nil {
		return 0, nil, err
	}
	return rev, kept, nil
}

func (f inspectFilter) keep(k *inspectedKey) bool {
	if f.kind != "" && k.Kind != f.kind {
		return false
	}
	if f.region != "" && k.Region != f.region {
		return false
	}
	if f.service != "" && k.Service != f.service {
		return false
	}
	return true
}

// attachLeases fills in each key's lease and its remaining TTL. Keys share
// leases (a node's, the replicator's per-origin lease, the tombstones'),
// so each lease is asked about once.
func attachLeases(ctx context.Context, cli *clientv3.Client, keys []*inspectedKey) error {
	type ttl struct{ remaining, granted int64 }
	seen := map[int64]ttl{}
	for _, k := range keys {
		if k.lease == 0 {
			continue
		}
		t, ok := seen[k.lease]
		if !ok {
			resp, err := cli.TimeToLive(ctx, clientv3.LeaseID(k.lease))
			if err != nil {
				return fmt.Errorf("lease %x of %s: %w", k.lease, k.Key, err)
			}
			t = ttl{resp.TTL, resp.GrantedTTL}
			seen[k.lease] = t
		}
		k.Lease = strconv.FormatInt(k.lease, 16)
		if t.remaining < 0 {
			// Expired between the read and this lookup: etcd deletes
			// the key at once, so it is as good as gone.
			k.LeaseGone = true
			continue
		}
		r, g := t.remaining, t.granted
		k.TTLSeconds, k.GrantedTTL = &r, &g
	}
	return nil
}

// decodeKey classifies a key by its shape and decodes its value. It never
// fails: what does not decode is reported in the key's Error.
func decodeKey(key string, value []byte) *inspectedKey {
	k := &inspectedKey{Key: key}
	fail := func(err error) *inspectedKey {
		k.Error = err.Error()
		k.Raw = hex.EncodeToString(value)
		k.Summary = "UNDECODABLE: " + err.Error()
		return k
	}
	switch {
	case registry.IsEndpointKey(key):
		k.Kind = kindEndpoint
		id, err := registry.ParseEndpointKey(key)
		if err != nil {
			return fail(err)
		}
		k.Region, k.Cluster, k.Service = id.Region, id.Cluster, id.Service
		ep, err := registry.DecodeEndpoint(key, value)
		if err != nil {
			return fail(err)
		}
		k.Node = ep.GetNode()
		if b, err := marshalJSON(ep); err == nil {
			k.Value = b
		}
		k.Summary = fmt.Sprintf("%s %s %s node=%s zone=%s %s weight=%d %s",
			registry.ProtocolName(ep.GetProtocol()), ep.GetIp(), portsString(ep.GetPorts()),
			orDash(ep.GetNode()), orDash(ep.GetZone()), stateName(ep.GetState()), ep.GetWeight(),
			registry.FormatStamp(ep.GetStamp()))
	case registry.IsNodeKey(key):
		k.Kind = kindNode
		id, err := registry.ParseNodeKey(key)
		if err != nil {
			return fail(err)
		}
		k.Region, k.Cluster, k.Node = id.Region, id.Cluster, id.Name
		n, err := registry.DecodeNode(key, value)
		if err != nil {
			return fail(err)
		}
		if b, err := marshalJSON(n); err == nil {
			k.Value = b
		}
		k.Summary = fmt.Sprintf("node %s addr=%s zone=%s services=%s health=%s", n.GetName(), orDash(n.GetAddress()),
			orDash(n.GetZone()), orDash(strings.Join(n.GetServices(), ",")), storedHealth(n))
	case strings.HasPrefix(key, registry.TombstoneRoot):
		k.Kind = kindTombstone
		id, err := registry.ParseEndpointKey(registry.Root + strings.TrimPrefix(key, registry.TombstoneRoot))
		if err != nil {
			return fail(fmt.Errorf("tombstone key: %w", err))
		}
		k.Region, k.Cluster, k.Service = id.Region, id.Cluster, id.Service
		st, err := registry.DecodeTombstone(value)
		if err != nil {
			return fail(err)
		}
		if b, err := marshalJSON(&registryv1.Tombstone{Stamp: st}); err == nil {
			k.Value = b
		}
		k.Summary = "deleted " + registry.FormatStamp(st)
	case strings.HasPrefix(key, replicator.ReplicationRoot):
		rest := strings.TrimPrefix(key, replicator.ReplicationRoot)
		region, what, _ := strings.Cut(rest, "/")
		k.Region = region
		switch what {
		case "fence":
			// JSON written by the origin's replicator on this (peer) etcd.
			k.Kind = kindFence
			if !json.Valid(value) {
				return fail(errors.New("fence value is not JSON"))
			}
			k.Value = value
			k.Summary = "replicator of region " + region + " writes here: " + string(value)
		case "home":
			k.Kind = kindHome
			k.Summary = "home etcd of region " + region + ", leader " + textValue(value)
			k.Value, _ = json.Marshal(string(value))
		default:
			k.Kind = kindUnknown
			k.Summary = textValue(value)
		}
	case strings.HasPrefix(key, "/aether/v1/election/"):
		k.Kind = kindElection
		rest := strings.TrimPrefix(key, "/aether/v1/election/")
		if r, ok := strings.CutPrefix(rest, "replicator/"); ok {
			k.Region, _, _ = strings.Cut(r, "/")
		}
		k.Summary = "candidate " + textValue(value)
		k.Value, _ = json.Marshal(string(value))
	case strings.HasPrefix(key, migrate.LegacyPrefix):
		k.Kind = kindLegacy
		ep := &registryv1.ServiceEndpoint{}
		if err := proto.Unmarshal(value, ep); err != nil {
			return fail(fmt.Errorf("legacy value: %w", err))
		}
		k.Service = ep.GetService()
		if b, err := marshalJSON(ep); err == nil {
			k.Value = b
		}
		k.Summary = "legacy schema (aether migrate --from-legacy): " + endpointLine(ep)
	default:
		k.Kind = kindUnknown
		k.Summary = textValue(value)
		if !utf8.Valid(value) {
			k.Raw = hex.EncodeToString(value)
		}
	}
	return k
}

// storedHealth is the health a node record claims, as stored.
func storedHealth(n *registryv1.Node) string {
	h := n.GetHealth()
	if h == nil {
		return "-"
	}
	return strings.ToLower(strings.TrimPrefix(h.GetStatus().String(), "HEALTH_"))
}

// textValue shows a value that should be text; binary shows as its length.
func textValue(v []byte) string {
	if utf8.Valid(v) {
		return strconv.Quote(string(v))
	}
	return fmt.Sprintf("<%d bytes binary>", len(v))
}

func writeInspectJSON(w io.Writer, rev int64, prefix string, keys []*inspectedKey) error {
	if keys == nil {
		keys = []*inspectedKey{}
	}
	b, err := json.MarshalIndent(inspectJSON{Revision: rev, Prefix: prefix, Keys: keys}, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func writeInspectTable(w io.Writer, rev int64, keys []*inspectedKey) error {
	counts := map[string]int{}
	for _, k := range keys {
		counts[k.Kind]++
	}
	var parts []string
	for _, kind := range allKinds {
		if n := counts[kind]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, kind))
		}
	}
	summary := "no keys"
	if len(parts) > 0 {
		summary = strings.Join(parts, ", ")
	}
	fmt.Fprintf(w, "revision %d: %d keys (%s)\n", rev, len(keys), summary)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tREGION\tCLUSTER\tNAME\tLEASE\tTTL\tVALUE\tKEY")
	for _, k := range keys {
		name := k.Service
		if k.Kind == kindNode {
			name = k.Node
		}
		lease, ttl := "-", "-"
		if k.Lease != "" {
			lease = k.Lease
			switch {
			case k.LeaseGone:
				ttl = "expired"
			case k.TTLSeconds != nil:
				ttl = fmt.Sprintf("%ds/%ds", *k.TTLSeconds, *k.GrantedTTL)
			}
		}
		if k.Mirrored {
			lease += " (mirrored)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.Kind, orDash(k.Region), orDash(k.Cluster), orDash(name), lease, ttl, k.Summary, k.Key)
	}
	return tw.Flush()
}
