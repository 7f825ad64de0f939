package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// workload makes endpoint changes in one region's subtree as the registrar
// would store them: real v1 keys, values encoded by registry.EncodeEndpoint
// (about 200 bytes). Of every ten changes of one writer, one deletes its
// oldest live endpoint, one updates a live endpoint (drains it, bumps its
// version) and the rest register new endpoints. Every value is unique (the
// change's sequence number is in its metadata) and a deleted endpoint is
// never registered again, which is what firstSeen relies on.
type workload struct {
	region string
	nextIP atomic.Int64
	seq    atomic.Int64
	epoch  time.Time
}

func newWorkload(region string) *workload {
	return &workload{region: region, epoch: time.Now().UTC().Truncate(time.Second)}
}

// writerState is one writer's endpoints: a writer only touches keys it
// created, so the per-key order of changes is the writer's order.
type writerState struct {
	id   int
	n    int
	live []*registryv1.ServiceEndpoint // oldest first
}

var benchZones = []string{"a", "b", "c"}

func (w *workload) endpoint(ipIndex int64) *registryv1.ServiceEndpoint {
	i := int(ipIndex)
	proto := registryv1.Protocol_PROTOCOL_HTTP1
	ports := []*registryv1.Port{{Name: "http", Port: 8080}, {Name: "admin", Port: 9901}}
	if i%3 == 0 {
		proto = registryv1.Protocol_PROTOCOL_GRPC
		ports = []*registryv1.Port{{Name: "grpc", Port: 9090}, {Name: "admin", Port: 9901}}
	}
	zone := w.region + "-" + benchZones[i%len(benchZones)]
	return &registryv1.ServiceEndpoint{
		Service:   fmt.Sprintf("svc-%02d", i%40),
		Protocol:  proto,
		Ip:        benchIP(i),
		Ports:     ports,
		Node:      fmt.Sprintf("node-%04d.%s", i/8, zone),
		Cluster:   "prod-1",
		Region:    w.region,
		Zone:      zone,
		State:     registryv1.State_STATE_SERVING,
		Weight:    100,
		CreatedAt: timestamppb.New(w.epoch),
	}
}

// next makes writer s's next change and applies it to cli.
func (w *workload) next(ctx context.Context, cli *clientv3.Client, s *writerState) (change, error) {
	j := s.n
	s.n++
	seq := w.seq.Add(1)
	var ep *registryv1.ServiceEndpoint
	switch {
	case j%10 == 9 && len(s.live) > 0:
		ep = s.live[0]
		s.live = s.live[1:]
		key, err := registry.IDOf(ep).Key()
		if err != nil {
			return change{}, err
		}
		resp, err := cli.Delete(ctx, key)
		if err != nil {
			return change{}, fmt.Errorf("delete %s: %w", key, err)
		}
		return change{Key: key, Del: true, Rev: resp.Header.Revision, Returned: time.Now()}, nil
	case j%10 == 4 && len(s.live) > 0:
		ep = s.live[j%len(s.live)]
		ep.State = registryv1.State_STATE_DRAINING
		ep.Weight = 0
	default:
		ep = w.endpoint(w.nextIP.Add(1) - 1)
		s.live = append(s.live, ep)
	}
	ep.UpdatedAt = timestamppb.New(w.epoch.Add(time.Duration(seq) * time.Millisecond))
	ep.Metadata = map[string]string{
		"pod":    fmt.Sprintf("%s-%d-%x", ep.Service, s.id, seq*2654435761%(1<<24)),
		"image":  fmt.Sprintf("registry.internal/%s:v2.%d.%d", ep.Service, seq%17, seq%5),
		"change": strconv.FormatInt(seq, 10),
	}
	key, err := registry.IDOf(ep).Key()
	if err != nil {
		return change{}, err
	}
	val, err := registry.EncodeEndpoint(ep)
	if err != nil {
		return change{}, err
	}
	resp, err := cli.Put(ctx, key, string(val))
	if err != nil {
		return change{}, fmt.Errorf("put %s: %w", key, err)
	}
	return change{Key: key, Val: string(val), Rev: resp.Header.Revision, Returned: time.Now()}, nil
}

// burst makes n changes as fast as writers concurrent writers can, each
// writer with its own keys, and returns them in revision order.
func (w *workload) burst(ctx context.Context, cli *clientv3.Client, n, writers int, states []*writerState) ([]change, error) {
	var (
		mu   sync.Mutex
		all  = make([]change, 0, n)
		wg   sync.WaitGroup
		errs = make([]error, writers)
	)
	for k := 0; k < writers; k++ {
		count := n / writers
		if k < n%writers {
			count++
		}
		wg.Go(func() {
			mine := make([]change, 0, count)
			for range count {
				c, err := w.next(ctx, cli, states[k])
				if err != nil {
					errs[k] = err
					break
				}
				mine = append(mine, c)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	sortByRev(all)
	return all, nil
}

// steady makes changes at rate per second (one writer, open loop: it does
// not slow down when a call is slow, it catches up) for d.
func (w *workload) steady(ctx context.Context, cli *clientv3.Client, rate int, d time.Duration, s *writerState) ([]change, error) {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	var out []change
	for i := 0; ; i++ {
		due := start.Add(time.Duration(i) * interval)
		if due.Sub(start) >= d {
			break
		}
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		c, err := w.next(ctx, cli, s)
		if err != nil {
			return out, err
		}
		out = append(out, c)
	}
	return out, nil
}
