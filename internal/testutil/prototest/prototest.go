// Package prototest has protobuf helpers for tests.
package prototest

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// UnknownBytes counts the bytes of unknown fields in m and in every message
// nested in it (lists and map values included). It re-encodes m and decodes
// it again discarding unknown fields, so it shares no code with the walkers
// it is used to check.
func UnknownBytes(t testing.TB, m proto.Message) int {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatalf("prototest: marshal %T: %v", m, err)
	}
	clean := m.ProtoReflect().New().Interface()
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, clean); err != nil {
		t.Fatalf("prototest: unmarshal %T: %v", m, err)
	}
	c, err := proto.MarshalOptions{Deterministic: true}.Marshal(clean)
	if err != nil {
		t.Fatalf("prototest: marshal %T: %v", clean, err)
	}
	return len(b) - len(c)
}
