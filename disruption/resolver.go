package disruption

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/client"
)

// maxSamples bounds the drop descriptions a Result keeps: the first drop
// of each of the first windows.
const maxSamples = 5

type dropKind int

const (
	noDrop dropKind = iota
	deadPick
	noneFound
	wrongPick
)

func (t *Tally) count(k dropKind) {
	t.Drops++
	switch k {
	case deadPick:
		t.DeadPicks++
	case noneFound:
		t.NoneFound++
	case wrongPick:
		t.WrongPicks++
	}
}

type windowKey struct {
	phase int
	svc   string
}

type windowAcc struct {
	Tally
	dead        map[string]bool
	first, last time.Duration
	sample      sample // the first drop
}

// resolverStats is one resolver's own record; merged once it has stopped.
type resolverStats struct {
	resolutions []int64 // per phase
	tallies     []Tally // per phase
	windows     map[windowKey]*windowAcc
}

type sample struct {
	at   time.Duration
	text string
}

func newResolverStats(phases int) *resolverStats {
	return &resolverStats{
		resolutions: make([]int64, phases),
		tallies:     make([]Tally, phases),
		windows:     map[windowKey]*windowAcc{},
	}
}

func (s *resolverStats) drop(ph, cause int, svc string, k dropKind, deadIP string, at time.Duration, desc func() string) {
	s.tallies[ph].count(k)
	key := windowKey{cause, svc}
	w := s.windows[key]
	if w == nil {
		w = &windowAcc{dead: map[string]bool{}, first: at, sample: sample{at, desc()}}
		s.windows[key] = w
	}
	w.count(k)
	w.last = at
	if deadIP != "" {
		w.dead[deadIP] = true
	}
}

// resolve is one resolver: it picks a SERVING endpoint of a random service
// from its client's cache and checks it against ground truth, at
// cfg.ResolveRate per second (or as fast as it can), until ctx ends.
func (b *battery) resolve(ctx context.Context, idx int, seed uint64, st *resolverStats) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	serving := make([]*registryv1.ServiceEndpoint, 0, 8)
	rate := float64(b.cfg.ResolveRate)
	var done int64
	for n := 0; ctx.Err() == nil; n++ {
		if rate > 0 {
			due := int64(time.Since(b.start).Seconds() * rate)
			if done >= due {
				time.Sleep(time.Millisecond)
				continue
			}
			// A resolver starved of CPU does not burst to catch up.
			done = max(done, due-int64(rate/20)-1) + 1
		} else if n%256 == 255 {
			time.Sleep(time.Millisecond) // leave CPU to the registrars on small machines
		}
		ph := int(b.phase.Load())
		svc := Services[rng.IntN(len(Services))]
		cl := b.clients[idx].Load()

		b.g.mu.RLock()
		eps, err := cl.Endpoints(ctx, svc)
		if err != nil {
			b.g.mu.RUnlock()
			if errors.Is(err, client.ErrClosed) || ctx.Err() != nil {
				continue // swapped out by the reconnect storm: not a resolution
			}
			b.fail(fmt.Errorf("resolver %d: %s: %w", idx, svc, err))
			return
		}
		serving = serving[:0]
		for _, e := range eps {
			if e.State == registryv1.State_STATE_SERVING {
				serving = append(serving, e)
			}
		}
		kind, cause, deadIP := noDrop, ph, ""
		var desc func() string
		if len(serving) == 0 {
			for _, p := range b.g.pods[svc] {
				if p.life == registered {
					kind = noneFound
					ip := p.ip
					desc = func() string {
						return fmt.Sprintf("no SERVING endpoint of %s while %s is registered and alive", svc, ip)
					}
					break
				}
			}
		} else {
			e := serving[rng.IntN(len(serving))]
			p := b.g.pods[svc][e.Ip]
			switch {
			case p == nil:
				kind = wrongPick
				desc = func() string { return fmt.Sprintf("picked %s %s, which never existed", svc, e.Ip) }
			case p.life == dead:
				kind, cause, deadIP = deadPick, p.retiredIn, e.Ip
				desc = func() string { return fmt.Sprintf("picked %s %s, which is dead", svc, e.Ip) }
			case len(e.Ports) != len(p.ports):
				kind = wrongPick
				desc = func() string { return fmt.Sprintf("picked %s %s with ports %v, want %v", svc, e.Ip, e.Ports, p.ports) }
			}
		}
		b.g.mu.RUnlock()

		st.resolutions[ph]++
		if kind != noDrop {
			at := time.Since(b.start)
			st.drop(ph, cause, svc, kind, deadIP, at, func() string {
				return fmt.Sprintf("%v in phase %q, resolver %d: %s", at.Round(time.Millisecond), b.phases[ph].name, idx, desc())
			})
		}
	}
}
