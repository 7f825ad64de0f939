// Package core is the pure core of the edge store: the change model, the
// MVCC index and etcd's request semantics. It does no I/O, reads no clock
// (time is passed in) and starts no goroutines.
package core

import (
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// ReplicaID names a replica. It is part of every change and of every lease
// id the replica grants.
type ReplicaID uint64

// Hash is a change id: the SHA-256 of its canonical encoding.
type Hash [32]byte

// HLC is a hybrid logical clock stamp.
type HLC struct {
	Wall    int64 // unix nanoseconds
	Logical uint32
}

// OpKind says what an Op does.
type OpKind uint8

// The resolved operations a change carries.
const (
	OpPut         OpKind = 1
	OpDelete      OpKind = 2
	OpLeaseGrant  OpKind = 3
	OpLeaseRevoke OpKind = 4
)

// Op is one resolved operation.
type Op struct {
	Kind  OpKind
	Key   []byte
	Value []byte
	Lease int64 // put: the attached lease (0: none); grant, revoke: the lease id
	TTL   int64 // grant: seconds
}

// Change is one node of the hash DAG.
type Change struct {
	Parents []Hash
	Replica ReplicaID
	Stamp   HLC
	Ops     []Op
}

var errNotYet = errors.New("core: not yet")

// Encode returns the canonical encoding.
func (c *Change) Encode() []byte { return nil }

// DecodeChange parses an encoding made by Encode.
func DecodeChange(b []byte) (*Change, error) { return nil, errNotYet }

// ID is the SHA-256 of the canonical encoding.
func (c *Change) ID() Hash { return Hash{} }

// Applied is what the shell must persist (Encoded, before acking) and
// publish (Events) for one change.
type Applied struct {
	ID      Hash
	Encoded []byte
	Index   uint64
	Rev     int64           // 0 when the change does not touch keys
	Events  []*mvccpb.Event // Kv.ModRevision == Rev; PrevKv filled when a previous value existed
}

// State is one replica's state.
type State struct {
	id ReplicaID
}

// New returns the empty state of replica id.
func New(id ReplicaID) *State { return &State{id: id} }

func (s *State) Rev() int64                            { return 0 }
func (s *State) CompactRev() int64                     { return 0 }
func (s *State) Index() uint64                         { return 0 }
func (s *State) Heads() []Hash                         { return nil }
func (s *State) RevisionOf(h Hash) (int64, bool)       { return 0, false }
func (s *State) HashOfRevision(rev int64) (Hash, bool) { return Hash{}, false }

func (s *State) Range(req *pb.RangeRequest) (*pb.RangeResponse, error) { return nil, errNotYet }
func (s *State) Put(now time.Time, req *pb.PutRequest) (*pb.PutResponse, *Applied, error) {
	return nil, nil, errNotYet
}
func (s *State) DeleteRange(now time.Time, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, *Applied, error) {
	return nil, nil, errNotYet
}
func (s *State) Txn(now time.Time, req *pb.TxnRequest) (*pb.TxnResponse, *Applied, error) {
	return nil, nil, errNotYet
}
func (s *State) Compact(rev int64) error { return errNotYet }
func (s *State) LeaseGrant(now time.Time, req *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, *Applied, error) {
	return nil, nil, errNotYet
}
func (s *State) LeaseRevoke(now time.Time, id int64) (*pb.LeaseRevokeResponse, *Applied, error) {
	return nil, nil, errNotYet
}
func (s *State) LeaseRenew(now time.Time, id int64) (ttl int64, err error) { return 0, errNotYet }
func (s *State) LeaseTimeToLive(now time.Time, req *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	return nil, errNotYet
}
func (s *State) Leases() *pb.LeaseLeasesResponse                             { return &pb.LeaseLeasesResponse{} }
func (s *State) ExpireLeases(now time.Time) []*Applied                       { return nil }
func (s *State) NextLeaseExpiry() (time.Time, bool)                          { return time.Time{}, false }
func (s *State) PromoteLeases(now time.Time)                                 {}
func (s *State) Events(from int64, key, end []byte) ([]*mvccpb.Event, error) { return nil, errNotYet }
func (s *State) HashKV(rev int64) (hash uint32, hashRev int64, err error)    { return 0, 0, errNotYet }
func (s *State) Replay(encoded []byte, index uint64, rev int64) error        { return errNotYet }
