package xds

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// resCache is what the feed writes and the feedCache watches: a
// go-control-plane LinearCache (Listeners, routes, Clusters) or an
// edsCache (the load assignments of one consumer locality).
type resCache interface {
	CreateWatch(*cachev3.Request, cachev3.Subscription, chan cachev3.Response) (func(), error)
	CreateDeltaWatch(*cachev3.DeltaRequest, cachev3.Subscription, chan cachev3.DeltaResponse) (func(), error)
	UpdateResources(put map[string]types.Resource, del []string) error
	// GetResources and NumWatches are for tests.
	GetResources() map[string]types.Resource
	NumWatches(name string) int
}

var (
	_ resCache = (*cachev3.LinearCache)(nil)
	_ resCache = (*edsCache)(nil)
)

// parkedFor is how long a stream's cancelled watch stays registered for
// the stream to re-arm it (see edsCache) before it is taken for a
// closed stream's and dropped. A re-arm follows its cancel at once on
// the stream's goroutine (the sotw server cancels, drains its channel,
// then opens the next watch), so this only bounds how long a closed
// stream's registration lingers; one dropped too early is merely
// registered again.
const parkedFor = 10 * time.Second

// edsCache is a cache of one non-full-state resource type (the load
// assignments of one consumer locality) with the versioning and answers
// of go-control-plane's LinearCache (linear.go computeResourceChange and
// computeResponse, for a type that state of the world sends changed
// resources of only), built for many streams watching ~20 names each.
//
// What it saves, per delivery, over the LinearCache (issue 14's fan-out:
// every change is a response to every stream watching the service, and
// the stream's ACK):
//   - A stream's watch survives its ACKs. go-control-plane's servers
//     cancel a stream's watch on every request and open the next one:
//     a LinearCache unregisters the watch from each name it watches and
//     registers the new one on each again (map deletes and inserts under
//     the cache's lock, 20 each here), and an answered watch is
//     unregistered as it fires. Here a watch is registered once per
//     stream and set of names (keyed by the response channel, which the
//     ADS and delta servers keep for the stream's life): cancel disarms
//     it, the next CreateWatch re-arms it, and a change answers only the
//     armed ones. Its names are re-indexed only when they change. (A
//     per-type state-of-the-world stream, EDS without ADS, is given a
//     new channel with every request by go-control-plane, so there
//     every request registers anew, as with a LinearCache, and the
//     registration it replaces is parked until swept.)
//   - Resources are marshalled once per version, not once per response:
//     each entry holds its anypb.Any (and, for delta, its
//     discovery.Resource with its hash version), which every response
//     carrying it shares (PassthroughResponse: the server only sets the
//     nonce of the response, which is per stream).
//
// A stream's end is not told to the cache (the server cancels its
// watches, as on every request): a watch cancelled and not re-armed for
// parkedFor is dropped at the next sweep (on an update or a watch, at
// most once a second).
type edsCache struct {
	typeURL string
	prefix  string
	now     func() time.Time

	mu      sync.Mutex
	version uint64
	res     map[string]*edsEntry
	byName  map[string]map[*edsWatch]struct{} // non-wildcard watches, by name watched
	wild    map[*edsWatch]struct{}
	streams map[any]*edsWatch // by response channel
	swept   time.Time         // the last sweep
	tick    uint64            // sweeps so far: a parked watch's clock
}

// edsEntry is one resource at one version, marshalled.
type edsEntry struct {
	res     types.Resource
	version string // the cache's version when it was put (state of the world)
	any     *anypb.Any
	delta   *discoverygrpc.Resource // its bytes' hash as version (delta)
}

// edsWatch is one stream's registration: its names, indexed, and the
// watch the server last opened (req, sub, out), armed until answered or
// cancelled.
type edsWatch struct {
	key   any
	delta bool
	names map[string]struct{} // a copy: the delta server edits the subscription's map in place
	// asked is the resource_names of the state-of-the-world request the
	// names were last checked against: the same list again (a client
	// ACKs with the names it asked for) is the same names, which a
	// comparison of strings tells cheaper than lookups of each name.
	asked []string
	wild  bool
	armed bool
	// parkedAt is 1 + the sweep tick at which it was cancelled, while it
	// is not re-armed; 0 otherwise.
	parkedAt uint64

	// sent is the known versions of the last response sent: when the
	// next watch's subscription holds these (the server recorded the
	// response) and watches the same names, only dirty, what changed
	// since, needs computing. pending is what the last computation found
	// removed and did not send (state of the world sends no removal
	// alone for this type).
	sent    map[string]string
	dirty   map[string]struct{}
	pending []string

	req  *cachev3.Request
	dreq *cachev3.DeltaRequest
	sub  cachev3.Subscription
	out  chan cachev3.Response
	dout chan cachev3.DeltaResponse
}

func newEDSCache(typeURL, prefix string) *edsCache {
	return &edsCache{
		typeURL: typeURL, prefix: prefix, now: time.Now,
		res: map[string]*edsEntry{}, byName: map[string]map[*edsWatch]struct{}{}, wild: map[*edsWatch]struct{}{},
		streams: map[any]*edsWatch{},
	}
}

func (c *edsCache) versionLocked() string { return c.prefix + strconv.FormatUint(c.version, 10) }

// UpdateResources puts and deletes resources and answers the armed
// watches that name them (and the wildcard ones). The version moves by
// one per call, as a LinearCache's does, also when a resource does not
// marshal (then nothing is changed and the error returned).
func (c *edsCache) UpdateResources(put map[string]types.Resource, del []string) error {
	entries := make(map[string]*edsEntry, len(put))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version++
	v := c.versionLocked()
	for name, r := range put {
		b, err := cachev3.MarshalResource(r)
		if err != nil {
			return fmt.Errorf("marshal %s: %w", name, err)
		}
		a := &anypb.Any{TypeUrl: c.typeURL, Value: b}
		entries[name] = &edsEntry{res: r, version: v, any: a, delta: &discoverygrpc.Resource{Name: name, Resource: a, Version: cachev3.HashResource(b)}}
	}
	mod := make(map[string]struct{}, len(entries)+len(del))
	touched := map[*edsWatch]struct{}{}
	for name, e := range entries {
		c.res[name] = e
		mod[name] = struct{}{}
		maps.Copy(touched, c.byName[name])
	}
	for _, name := range del {
		delete(c.res, name)
		mod[name] = struct{}{}
		maps.Copy(touched, c.byName[name])
	}
	maps.Copy(touched, c.wild)
	for w := range touched {
		if w.armed {
			// Armed, w was up to date but for what changed since.
			c.answerLocked(w, false, false, mod)
			continue
		}
		// Not armed (its response in flight, or its stream gone): what
		// changed is looked at when it is re-armed.
		if w.dirty == nil {
			w.dirty = map[string]struct{}{}
		}
		for name := range mod {
			if _, ok := w.names[name]; ok || w.wild {
				w.dirty[name] = struct{}{}
			}
		}
	}
	c.sweepLocked()
	return nil
}

// answerLocked sends w its response, if it has one due, and disarms it
// then; it reports whether it sent. full computes what the stream lacks
// over all it watches (linear.go computeResourceChange), else over only:
// the names that can have moved since w was last computed in full.
func (c *edsCache) answerLocked(w *edsWatch, replyEvenIfEmpty, full bool, only map[string]struct{}) bool {
	version := sotwVersion
	if w.delta {
		version = deltaVersion
	}
	var changed, removed []string
	if full {
		changed, removed = c.changesLocked(w, version)
	} else {
		changed, removed = c.changesInLocked(w, version, only)
	}
	if w.delta {
		if len(changed) == 0 && len(removed) == 0 && !replyEvenIfEmpty {
			w.pending = nil
			return false
		}
	} else if len(changed) == 0 && !replyEvenIfEmpty {
		// A removal alone is not sent in state of the world for this
		// type; it goes with the next response.
		w.pending = removed
		return false
	}
	next := c.nextKnownLocked(w, changed, removed, version)
	w.armed, w.sent, w.dirty, w.pending = false, next, nil, nil
	if w.delta {
		res := make([]*discoverygrpc.Resource, 0, len(changed))
		for _, name := range changed {
			res = append(res, c.res[name].delta)
		}
		w.dout <- &cachev3.DeltaPassthroughResponse{ // buffered: a stream has one watch of a type armed at most
			DeltaRequest:   w.dreq,
			NextVersionMap: next,
			DeltaDiscoveryResponse: &discoverygrpc.DeltaDiscoveryResponse{
				Resources: res, RemovedResources: removed, TypeUrl: c.typeURL, SystemVersionInfo: c.versionLocked(),
			},
		}
		return true
	}
	res := make([]*anypb.Any, 0, len(changed))
	for _, name := range changed {
		res = append(res, c.res[name].any)
	}
	w.out <- &cachev3.PassthroughResponse{
		Request:           w.req,
		DiscoveryResponse: &discoverygrpc.DiscoveryResponse{VersionInfo: c.versionLocked(), Resources: res, TypeUrl: c.typeURL},
		ReturnedResources: next,
	}
	return true
}

// changesLocked is computeResourceChange of linear.go: the subscribed
// resources the stream does not hold at their version, and what it
// holds that is gone or no longer subscribed.
func (c *edsCache) changesLocked(w *edsWatch, version func(*edsEntry) string) (changed, removed []string) {
	known := w.sub.ReturnedResources()
	if w.sub.IsWildcard() {
		for name, e := range c.res {
			if v, ok := known[name]; !ok || v != version(e) {
				changed = append(changed, name)
			}
		}
		for name := range known {
			if c.res[name] == nil {
				removed = append(removed, name)
			}
		}
		return changed, removed
	}
	subscribed := w.sub.SubscribedResources()
	for name := range subscribed {
		e := c.res[name]
		v, ok := known[name]
		if e == nil {
			if ok {
				removed = append(removed, name)
			}
			continue
		}
		if !ok || v != version(e) {
			changed = append(changed, name)
		}
	}
	for name := range known {
		if _, ok := subscribed[name]; !ok {
			removed = append(removed, name)
		}
	}
	return changed, removed
}

// changesInLocked is changesLocked over the names in only, for a watch
// whose last full computation (or response) is current for every other
// name: the known versions and the subscription are the same (the
// server changes them only between a cancel and the next watch), and
// the cache's resources changed only in only. What that computation
// found removed and did not send (pending) is removed still unless it
// came back.
func (c *edsCache) changesInLocked(w *edsWatch, version func(*edsEntry) string, only map[string]struct{}) (changed, removed []string) {
	known := w.sub.ReturnedResources()
	subscribed := w.sub.SubscribedResources()
	wild := w.sub.IsWildcard()
	in := func(name string) bool {
		_, ok := subscribed[name]
		return ok || wild
	}
	for _, name := range w.pending {
		if _, moved := only[name]; moved && c.res[name] != nil && in(name) {
			continue // back: changedIn sees it below
		}
		removed = append(removed, name)
	}
	for name := range only {
		if !in(name) {
			continue
		}
		e := c.res[name]
		v, ok := known[name]
		if e == nil {
			if ok && !slices.Contains(w.pending, name) {
				removed = append(removed, name)
			}
			continue
		}
		if !ok || v != version(e) {
			changed = append(changed, name)
		}
	}
	return changed, removed
}

func (c *edsCache) nextKnownLocked(w *edsWatch, changed, removed []string, version func(*edsEntry) string) map[string]string {
	next := maps.Clone(w.sub.ReturnedResources())
	if next == nil {
		next = make(map[string]string, len(changed))
	}
	for _, name := range changed {
		next[name] = version(c.res[name])
	}
	for _, name := range removed {
		delete(next, name)
	}
	return next
}

func sotwVersion(e *edsEntry) string  { return e.version }
func deltaVersion(e *edsEntry) string { return e.delta.GetVersion() }

// watchLocked is the stream's registration for key, made or re-indexed
// when its names changed; same is false then. asked is a state-of-the-
// world request's resource_names (nil for delta); unchanged says the
// caller knows the names to be those of the stream's last watch.
func (c *edsCache) watchLocked(key any, delta bool, sub cachev3.Subscription, asked []string, unchanged bool) (w *edsWatch, same bool) {
	w = c.streams[key]
	if w != nil && w.delta == delta {
		w.parkedAt = 0
		quick := unchanged || asked != nil && slices.Equal(asked, w.asked)
		w.asked = asked
		if w.wild != sub.IsWildcard() || !quick && !sameNames(w.names, sub.SubscribedResources()) {
			c.unindexLocked(w)
			c.indexLocked(w, sub)
			return w, false
		}
		return w, true
	}
	if w != nil {
		c.dropLocked(w)
	}
	w = &edsWatch{key: key, delta: delta, asked: asked}
	c.indexLocked(w, sub)
	c.streams[key] = w
	return w, false
}

// sameMap reports whether a and b are one map (not equal ones): the
// known versions the server holds are the very map of the last response
// when it recorded that response.
func sameMap(a, b map[string]string) bool {
	return a != nil && b != nil && reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func sameNames(a, b map[string]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			return false
		}
	}
	return true
}

// indexLocked registers w on its names; a wildcard watch is in wild
// only (as a LinearCache's).
func (c *edsCache) indexLocked(w *edsWatch, sub cachev3.Subscription) {
	w.wild = sub.IsWildcard()
	w.names = maps.Clone(sub.SubscribedResources())
	if w.wild {
		c.wild[w] = struct{}{}
		return
	}
	for name := range w.names {
		m := c.byName[name]
		if m == nil {
			m = map[*edsWatch]struct{}{}
			c.byName[name] = m
		}
		m[w] = struct{}{}
	}
}

func (c *edsCache) unindexLocked(w *edsWatch) {
	if w.wild {
		delete(c.wild, w)
		return
	}
	for name := range w.names {
		if m := c.byName[name]; m != nil {
			delete(m, w)
			if len(m) == 0 {
				delete(c.byName, name)
			}
		}
	}
}

func (c *edsCache) dropLocked(w *edsWatch) {
	c.unindexLocked(w)
	if c.streams[w.key] == w {
		delete(c.streams, w.key)
	}
	w.armed = false
}

// cancelFn disarms w: the server will not read an answer for this watch
// (it opens the next, or the stream ends). w stays registered, parked,
// for the next CreateWatch of its stream.
func (c *edsCache) cancelFn(w *edsWatch) func() {
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.armed = false
		if c.streams[w.key] == w {
			// The sweep's tick, not the time: a cancel on every ACK
			// should cost no clock read. +1: zero is "not parked".
			w.parkedAt = c.tick + 1
		}
	}
}

// sweepLocked drops the watches parked for parkedFor (as many sweeps,
// a sweep being at most once a second): the closed streams'.
func (c *edsCache) sweepLocked() {
	now := c.now()
	if now.Sub(c.swept) < time.Second {
		return
	}
	c.swept = now
	c.tick++
	for _, w := range c.streams {
		if w.parkedAt != 0 && c.tick+1-w.parkedAt >= uint64(parkedFor/time.Second) {
			c.dropLocked(w)
		}
	}
}

// CreateWatch opens (re-arms) the state-of-the-world watch of the stream
// whose response channel is out, answering at once what it lacks, as a
// LinearCache does: everything asked for when the request's version is
// empty or not this cache's.
func (c *edsCache) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) (func(), error) {
	if req.GetTypeUrl() != c.typeURL {
		return nil, fmt.Errorf("request type %s does not match cache type %s", req.GetTypeUrl(), c.typeURL)
	}
	replyEvenIfEmpty := req.GetVersionInfo() == "" || !strings.HasPrefix(req.GetVersionInfo(), c.prefix)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked()
	w, same := c.watchLocked(out, false, sub, req.GetResourceNames(), false)
	w.req, w.sub, w.out, w.armed = req, sub, out, true
	full := replyEvenIfEmpty || !same || !sameMap(sub.ReturnedResources(), w.sent)
	c.answerLocked(w, replyEvenIfEmpty, full, w.dirty)
	w.dirty = nil
	return c.cancelFn(w), nil
}

// CreateDeltaWatch opens (re-arms) the delta watch of the stream whose
// response channel is out, as CreateWatch; a wildcard stream's first
// request is answered even if empty, as a LinearCache's.
func (c *edsCache) CreateDeltaWatch(req *cachev3.DeltaRequest, sub cachev3.Subscription, out chan cachev3.DeltaResponse) (func(), error) {
	if req.GetTypeUrl() != c.typeURL {
		return nil, fmt.Errorf("request type %s does not match cache type %s", req.GetTypeUrl(), c.typeURL)
	}
	replyEvenIfEmpty := sub.IsWildcard() && req.GetResponseNonce() == ""
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked()
	// A delta request that neither subscribes nor unsubscribes (an ACK)
	// leaves the stream's names as they were
	// (stream.Subscription.UpdateResourceSubscriptions); one that does
	// may have edited the known versions in place: computed in full then.
	names := len(req.GetResourceNamesSubscribe()) > 0 || len(req.GetResourceNamesUnsubscribe()) > 0
	w, same := c.watchLocked(out, true, sub, nil, !names)
	w.dreq, w.sub, w.dout, w.armed = req, sub, out, true
	full := replyEvenIfEmpty || !same || names || !sameMap(sub.ReturnedResources(), w.sent)
	c.answerLocked(w, replyEvenIfEmpty, full, w.dirty)
	w.dirty = nil
	return c.cancelFn(w), nil
}

// GetResources is the resources held, as a LinearCache's.
func (c *edsCache) GetResources() map[string]types.Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]types.Resource, len(c.res))
	for name, e := range c.res {
		out[name] = e.res
	}
	return out
}

// NumWatches is the armed watches on a name, wildcard ones included, as
// a LinearCache's open watches.
func (c *edsCache) NumWatches(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for w := range c.byName[name] {
		if w.armed {
			n++
		}
	}
	for w := range c.wild {
		if w.armed {
			n++
		}
	}
	return n
}

// watches is the registrations held and those armed (for tests).
func (c *edsCache) watches() (registered, armed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.streams {
		registered++
		if w.armed {
			armed++
		}
	}
	return registered, armed
}
