package disruption

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// Services are the battery's services, as in the seed: svc-5 is the
// multi-port one.
var Services = []string{"svc-1", "svc-2", "svc-3", "svc-4", "svc-5"}

// multiPort is the service whose endpoints expose two ports (h1 and h2c).
const multiPort = "svc-5"

func portsOf(svc string) []*registryv1.Port {
	if svc == multiPort {
		return []*registryv1.Port{{Name: "h1", Port: 8080}, {Name: "h2c", Port: 3001}}
	}
	return []*registryv1.Port{{Name: "http", Port: 8080}}
}

// life is where a pod is in its life. Only registered endpoints are
// required to be found; pending and draining ones are alive (a resolver may
// still pick them from a stale cache) but need not be found; dead ones must
// never be picked.
type life int

const (
	pending    life = iota // alive, register sent but not acknowledged (surge)
	registered             // alive, registered SERVING and acknowledged
	draining               // alive, drain decided: no new traffic required
	dead                   // deregistered (acknowledged) and gone
)

type pod struct {
	svc, ip string
	ports   []*registryv1.Port
	life    life
	// retiredIn is the phase in which the pod was drained: a resolution
	// that picks it once dead is a drop of that phase's roll window.
	retiredIn int
}

// truth is the set of pods. Every transition takes the write lock; a
// resolver holds the read lock across reading its client's cache, picking
// and checking, so a resolution and a death are totally ordered: a pod
// reported dead was dead when the cache was read.
type truth struct {
	mu   sync.RWMutex
	pods map[string]map[string]*pod // service -> ip -> pod
	next atomic.Uint32
}

func newTruth() *truth {
	g := &truth{pods: map[string]map[string]*pod{}}
	for _, s := range Services {
		g.pods[s] = map[string]*pod{}
	}
	return g
}

// spawn starts a new pod of svc: it is alive before it registers.
func (g *truth) spawn(svc string) *pod {
	n := g.next.Add(1)
	p := &pod{svc: svc, ip: fmt.Sprintf("10.%d.%d.%d", 1+n/65536, (n/256)%256, n%256), ports: portsOf(svc), life: pending}
	g.mu.Lock()
	g.pods[svc][p.ip] = p
	g.mu.Unlock()
	return p
}

func (g *truth) set(p *pod, l life) {
	g.mu.Lock()
	p.life = l
	g.mu.Unlock()
}

// retire marks p draining in phase ph.
func (g *truth) retire(p *pod, ph int) {
	g.mu.Lock()
	p.life, p.retiredIn = draining, ph
	g.mu.Unlock()
}

func (g *truth) lifeOf(p *pod) life {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return p.life
}

// registered returns the registered pods of svc, ordered by IP.
func (g *truth) registered(svc string) []*pod {
	g.mu.RLock()
	var out []*pod
	for _, p := range g.pods[svc] {
		if p.life == registered {
			out = append(out, p)
		}
	}
	g.mu.RUnlock()
	slices.SortFunc(out, func(x, y *pod) int { return cmp.Compare(x.ip, y.ip) })
	return out
}
