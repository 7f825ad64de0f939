// Package migrate moves endpoints from the legacy flat schema,
//
//	/aether/services/<service>/protocols/<proto>/endpoints/<ip>
//
// into schema v1, whose keys put the origin first
// (/aether/v1/regions/<region>/clusters/<cluster>/...). The legacy key has no
// origin, so each entry is placed by the origin its value carries; an entry
// whose value does not name one cannot be placed and stops the migration
// before anything is deleted. The legacy prefix is range-deleted only after
// every entry has been copied (and read back), so an interrupted run can
// simply be run again.
package migrate

import (
	"context"
	"fmt"
	"io"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// LegacyPrefix is the flat schema's root.
const LegacyPrefix = "/aether/services/"

// maxTxnOps is etcd's default --max-txn-ops.
const maxTxnOps = 128

// Report says what a migration did (or, dry, would do).
type Report struct {
	Legacy  int // legacy keys found
	Copied  int // v1 keys written
	Present int // v1 keys that already held the same endpoint
	Deleted int // legacy keys removed
}

type entry struct {
	legacyKey string
	v1Key     string
	value     []byte
	ep        *registryv1.ServiceEndpoint
}

// FromLegacy copies every legacy endpoint into schema v1 and then deletes
// the legacy prefix. With dryRun it only reports, writing nothing. Progress
// lines go to w.
func FromLegacy(ctx context.Context, cli *clientv3.Client, dryRun bool, w io.Writer) (Report, error) {
	var rep Report
	resp, err := cli.Get(ctx, LegacyPrefix, clientv3.WithPrefix())
	if err != nil {
		return rep, fmt.Errorf("reading the legacy prefix %s: %w", LegacyPrefix, err)
	}
	rep.Legacy = len(resp.Kvs)
	entries := make([]entry, 0, len(resp.Kvs))
	var problems []string
	for _, kv := range resp.Kvs {
		e, err := plan(string(kv.Key), kv.Value)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		entries = append(entries, e)
	}
	if len(problems) > 0 {
		return rep, fmt.Errorf("%d legacy entries cannot be placed in schema v1 (nothing was written):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	// What is already there, so a re-run after an interruption is a no-op
	// for the part that was done.
	var todo []entry
	for _, e := range entries {
		cur, err := cli.Get(ctx, e.v1Key)
		if err != nil {
			return rep, fmt.Errorf("reading %s: %w", e.v1Key, err)
		}
		if len(cur.Kvs) == 1 {
			if have, err := registry.DecodeEndpoint(e.v1Key, cur.Kvs[0].Value); err == nil && proto.Equal(have, e.ep) {
				rep.Present++
				fmt.Fprintf(w, "present %s\n", e.v1Key)
				continue
			}
		}
		todo = append(todo, e)
		fmt.Fprintf(w, "%s %s -> %s\n", map[bool]string{true: "would copy", false: "copy"}[dryRun], e.legacyKey, e.v1Key)
	}
	if dryRun {
		rep.Copied = len(todo)
		if rep.Legacy > 0 {
			fmt.Fprintf(w, "would delete %d legacy keys under %s\n", rep.Legacy, LegacyPrefix)
			rep.Deleted = rep.Legacy
		}
		return rep, nil
	}
	for i := 0; i < len(todo); i += maxTxnOps {
		chunk := todo[i:min(i+maxTxnOps, len(todo))]
		ops := make([]clientv3.Op, len(chunk))
		for j, e := range chunk {
			ops[j] = clientv3.OpPut(e.v1Key, string(e.value))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return rep, fmt.Errorf("copying entries %d-%d (legacy keys untouched; run again to resume): %w", i, i+len(chunk)-1, err)
		}
		rep.Copied += len(chunk)
	}
	// Read back before deleting anything.
	for _, e := range entries {
		cur, err := cli.Get(ctx, e.v1Key)
		if err != nil || len(cur.Kvs) != 1 {
			return rep, fmt.Errorf("verifying %s before deleting the legacy prefix: %v (legacy keys untouched)", e.v1Key, err)
		}
	}
	if rep.Legacy > 0 {
		del, err := cli.Delete(ctx, LegacyPrefix, clientv3.WithPrefix())
		if err != nil {
			return rep, fmt.Errorf("deleting the legacy prefix (every entry is already copied; run again to finish): %w", err)
		}
		rep.Deleted = int(del.Deleted)
		fmt.Fprintf(w, "deleted %d legacy keys under %s\n", rep.Deleted, LegacyPrefix)
	}
	return rep, nil
}

// plan maps one legacy entry to its v1 key, checking that the value is the
// endpoint the legacy key names and that it carries its origin.
func plan(key string, value []byte) (entry, error) {
	rest := strings.TrimPrefix(key, LegacyPrefix)
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "protocols" || parts[3] != "endpoints" {
		return entry{}, fmt.Errorf("%s: not a legacy endpoint key (%sSERVICE/protocols/PROTO/endpoints/IP)", key, LegacyPrefix)
	}
	ep := &registryv1.ServiceEndpoint{}
	if err := proto.Unmarshal(value, ep); err != nil {
		return entry{}, fmt.Errorf("%s: value is not a ServiceEndpoint: %v", key, err)
	}
	if ep.GetService() != parts[0] {
		return entry{}, fmt.Errorf("%s: value names service %q", key, ep.GetService())
	}
	if p, err := registry.ParseProtocol(parts[2]); err != nil || p != ep.GetProtocol() {
		return entry{}, fmt.Errorf("%s: protocol segment %q does not match the value's %s", key, parts[2], ep.GetProtocol())
	}
	ip, err := registry.CanonicalIP(parts[4])
	if err != nil || ip != ep.GetIp() {
		return entry{}, fmt.Errorf("%s: ip segment %q does not match the value's %q", key, parts[4], ep.GetIp())
	}
	if ep.GetRegion() == "" || ep.GetCluster() == "" {
		return entry{}, fmt.Errorf("%s: value carries no origin (region %q, cluster %q); register it again through its cluster's registrar", key, ep.GetRegion(), ep.GetCluster())
	}
	v1, err := registry.IDOf(ep).Key()
	if err != nil {
		return entry{}, fmt.Errorf("%s: %v", key, err)
	}
	val, err := registry.EncodeEndpoint(ep)
	if err != nil {
		return entry{}, err
	}
	return entry{legacyKey: key, v1Key: v1, value: val, ep: ep}, nil
}
