package edge

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/edge/internal/core"
)

// Structured values (--value-merge, --value-merge-prefix): which keys merge
// as JSON documents is decided in the core (merge_json.go); the shell
// checks the setting, keeps it per data directory and makes sure every
// replica a change travels between reads it alike.
//
// A change on a JSON key carries a patch, not the client's bytes, and a
// replica reading it as bytes would serve the patch; a replica reading a
// plain change as JSON would merge it as a whole-value write while its
// author merged it as bytes. Either way replicas would diverge without
// noticing, so:
//
//   - the data directory remembers the setting it was written with, and a
//     restart with another one is refused (recover);
//   - a Push stream carries the sender's setting (gRPC metadata
//     valueMergeMD) and the receiver refuses a stream whose setting is not
//     its own, with FailedPrecondition naming both; the sender logs it and
//     retries with backoff, so replicas restarted with a fixed setting
//     reconnect on their own. Changes do not flow between misconfigured
//     replicas; each keeps serving its own writes.

// valueMergeMD is the metadata key of the sender's setting on a Push
// stream. A sender that sends none predates JSON merge: it merges bytes.
const valueMergeMD = "aether-value-merge"

const metaValueMerge = "value-merge"

// valueMergeOf checks the Config's setting and returns the core's form.
func valueMergeOf(cfg Config) (core.ValueMerge, error) {
	var vm core.ValueMerge
	switch cfg.ValueMerge {
	case "", "bytes":
	case "json":
		vm.JSON = true
	default:
		return vm, fmt.Errorf("edge: value merge %q: valid values are \"bytes\", \"json\"", cfg.ValueMerge)
	}
	for _, p := range cfg.ValueMergePrefixes {
		if p == "" {
			return vm, errors.New("edge: a JSON value-merge prefix is empty (use value merge \"json\" for every key)")
		}
		vm.Prefixes = append(vm.Prefixes, []byte(p))
	}
	if vm.JSON && len(vm.Prefixes) > 0 {
		return vm, errors.New("edge: value merge \"json\" already merges every key as JSON: drop the prefixes, or use \"bytes\" with them")
	}
	return vm, nil
}

// checkValueMergeMeta refuses a data directory written with another
// setting, and records the setting in one that has none.
func (s *Server) checkValueMergeMeta() error {
	want := s.valueMerge.String()
	got, err := s.store.Meta(metaValueMerge)
	if err != nil {
		return fmt.Errorf("edge: read %s: %w", metaValueMerge, err)
	}
	if len(got) == 0 {
		if err := s.store.SetMeta(metaValueMerge, []byte(want)); err != nil {
			return fmt.Errorf("edge: persist %s: %w", metaValueMerge, err)
		}
		return nil
	}
	if string(got) != want {
		return fmt.Errorf("edge: %s was written with value merge %s, this replica is configured with %s: "+
			"start it with the same --value-merge and --value-merge-prefix, or with a new data directory", s.cfg.DataDir, got, want)
	}
	return nil
}

// withValueMerge is the Push stream's context carrying this replica's
// setting.
func (s *Server) withValueMerge(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, valueMergeMD, s.valueMerge.String())
}

// checkPeerValueMerge is the receiver's check of a Push stream.
func (s *Server) checkPeerValueMerge(ctx context.Context, peer string) error {
	theirs := "bytes"
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(valueMergeMD); len(v) > 0 {
			theirs = v[0]
		}
	}
	if mine := s.valueMerge.String(); theirs != mine {
		return status.Errorf(codes.FailedPrecondition,
			"edgesync: %s merges values as %s, this replica (%s) as %s: every replica must be started with the same --value-merge and --value-merge-prefix",
			peer, theirs, s.cfg.Name, mine)
	}
	return nil
}

// isValueMergeRefusal tells a refused handshake from a broken link, so the
// sender says so loudly.
func isValueMergeRefusal(err error) bool {
	return status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "merges values as")
}
