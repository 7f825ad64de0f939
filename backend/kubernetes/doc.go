// Package kubernetes is the Kubernetes objects backend of the registry: it
// keeps the registry in a cluster's own API server as custom resources, so
// a registrar inside Kubernetes needs nothing else to run. A *Store is a
// backend.Store, Watcher and Digester (Leases and Members are nodes.go,
// leases.go and members.go, on coordination.k8s.io Leases). Other packages
// import it as kubestore.
//
// # Objects
//
// Two CRDs of group aether.dev/v1alpha1, namespaced, in crds/ (embedded,
// and applied by New when Config.InstallCRDs, else checked): an
// AetherEndpoint per endpoint key and an AetherNode per node record. An
// object's name is derived from its registry key (names.go: a readable
// prefix and a hash), the full key is in spec.key and in the
// aether.dev/key annotation, and the spec carries the record's fields one
// for one (crd.go), validated by the CRD's openAPIV3Schema (enums,
// ranges, the key's shape), so a value read back is proto.Equal to the one
// written and a hand edit that would not decode is refused at the door.
//
// # Revisions are resourceVersions
//
// The contract wants int64 revisions, per store, increasing with every
// write, comparable, and one revision per listing. On the API server, a
// resourceVersion is etcd's revision: every write to any object moves the
// one etcd revision the whole API server shares, an object's
// resourceVersion is the revision of its last write (its mod revision), a
// list's is the revision it is consistent at, and a watch from it resumes
// without gap. Kubernetes long documented resourceVersions as opaque;
// KEP-5504 (comparable resource versions) makes them integers that
// compare as integers within a resource, and apimachinery (v0.37.2 here)
// ships k8s.io/apimachinery/pkg/util/resourceversion.CompareResourceVersion
// for exactly that comparison, which parseRV uses to tell a well-formed
// one. The backend relies on a little more: that its two resources'
// resourceVersions compare with each other, which holds because both live
// in the one etcd (it would not if --etcd-servers-overrides put
// aetherendpoints and aethernodes on different etcd clusters: do not).
// parseRV accepts only well-formed positive integers that fit an int64.
//
// If an API server ever served resourceVersions that are not integers (an
// aggregated or non-etcd storage layer may; the API convention allows
// it), nothing of the above would hold: listings, GetAt and watches could
// not be ordered or resumed, and write ordering would silently break.
// New therefore reads a resourceVersion from each resource and refuses to
// start, naming the reason and the etcd backend as the way out, rather
// than run on a server it cannot order.
//
// # Writes
//
// ApplyOrdered (endpoints.go) gives every mutation one API call on its
// object, conditional on the resourceVersion the writer last saw (an
// update carrying it) or on absence (a create); a 409 Conflict or
// AlreadyExists re-reads the object with a quorum GET and decides by stamp
// again. A delete turns the object into a tombstone that keeps the stamp
// (label aether.dev/tombstone), so a write stamped before the delete but
// flushed after it is Superseded, as on etcd; List, GetAt, GetEndpoint,
// the digest and the feed never report a tombstone as a record, and the
// store collects tombstones TombstoneTTL (10 minutes, as etcd's) after
// they were written, each delete conditional on the tombstone's
// resourceVersion so that a key revived meanwhile stays. A batch's
// mutations land each at its own revision (there are no multi-object
// transactions), at most MaxInFlight API calls at a time.
//
// # Reads
//
// List pages with limit/continue: the first page of endpoints is a
// consistent read (no resourceVersion: etcd's current revision, served by
// the watch cache once it has caught up), its resourceVersion R pins the
// remaining pages (continue tokens carry it) and the node records are
// listed at R exactly; a 410 while paging (R compacted) starts the listing
// over, and after three such failures it reports backend.ErrCompacted.
// GetEndpoint is a consistent list of the one object by name, so it also
// reports the current revision. GetAt lists at resourceVersion=rev with
// resourceVersionMatch=Exact, selecting the asked objects by their
// key-hash label; a 410 is backend.ErrCompacted. The digest (digest.go) is
// a metadata-only listing (PartialObjectMetadataList).
//
// # The feed
//
// Watch (watch.go) is an informer's watch without its cache: one watch per
// resource from afterRev with allowWatchBookmarks, re-established from the
// last resourceVersion after any break, merged into the contract's one
// ordered feed by holding each event until both streams have passed its
// revision, which an idle stream is made to show by a write of a small
// fence object. 410 Gone, or a resume revision found compacted, ends the
// feed with one WatchBatch{Compacted: true}; the registrar then re-lists.
package kubernetes
