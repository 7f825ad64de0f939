package edge

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

type fakeChecks struct {
	ready   atomic.Bool
	readErr atomic.Pointer[error]
	alarm   atomic.Int32 // pb.AlarmType; 0 = none
}

func (f *fakeChecks) checks() httpChecks {
	return httpChecks{
		Ready: f.ready.Load,
		Read: func(context.Context) error {
			if p := f.readErr.Load(); p != nil {
				return *p
			}
			return nil
		},
		Alarms: func() []*pb.AlarmMember {
			if a := pb.AlarmType(f.alarm.Load()); a != pb.AlarmType_NONE {
				return []*pb.AlarmMember{{MemberID: 1, Alarm: a}}
			}
			return nil
		},
	}
}

func get(t *testing.T, srv *httptest.Server, method, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestHTTPHealthIsEtcds(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := &fakeChecks{}
	h, err := newHTTPHandler(reg, nil, f.checks())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	health := func() (int, healthStatus) {
		t.Helper()
		code, body := get(t, srv, http.MethodGet, "/health")
		var hs healthStatus
		if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &hs); err != nil {
			t.Fatalf("/health body %q: %v", body, err)
		}
		return code, hs
	}

	if code, hs := health(); code != http.StatusServiceUnavailable || hs.Health != "false" || hs.Reason != "NOT READY" {
		t.Errorf("before ready: %d %+v", code, hs)
	}
	f.ready.Store(true)
	// etcd's exact body for a healthy member.
	if code, body := get(t, srv, http.MethodGet, "/health"); code != http.StatusOK || body != `{"health":"true","reason":""}` {
		t.Errorf("healthy: %d %q", code, body)
	}
	rangeErr := errors.New("etcdserver: request timed out")
	f.readErr.Store(&rangeErr)
	if code, hs := health(); code != http.StatusServiceUnavailable || hs.Reason != "RANGE ERROR:etcdserver: request timed out" {
		t.Errorf("failing read: %d %+v", code, hs)
	}
	f.readErr.Store(nil)
	f.alarm.Store(int32(pb.AlarmType_NOSPACE))
	if code, hs := health(); code != http.StatusServiceUnavailable || hs.Reason != "ALARM NOSPACE" {
		t.Errorf("NOSPACE alarm: %d %+v", code, hs)
	}
	if code, _ := get(t, srv, http.MethodGet, "/health?exclude=NOSPACE"); code != http.StatusOK {
		t.Errorf("excluded alarm: %d", code)
	}
	f.alarm.Store(0)
	if code, _ := get(t, srv, http.MethodPost, "/health"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /health: %d", code)
	}

	// /metrics serves the registry, with etcd's health counters on it.
	code, body := get(t, srv, http.MethodGet, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{"etcd_server_health_success 2", "etcd_server_health_failures 3"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	// A second handler on the same registry shares the counters.
	if _, err := newHTTPHandler(reg, nil, f.checks()); err != nil {
		t.Errorf("second handler on one registry: %v", err)
	}
}

func TestHTTPLivezReadyzVersion(t *testing.T) {
	f := &fakeChecks{}
	f.ready.Store(true)
	h, err := newHTTPHandler(prometheus.NewRegistry(), nil, f.checks())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	for _, p := range []string{"/livez", "/readyz", "/readyz/linearizable_read"} {
		if code, body := get(t, srv, http.MethodGet, p); code != http.StatusOK || body != "ok\n" {
			t.Errorf("%s: %d %q", p, code, body)
		}
	}
	_, body := get(t, srv, http.MethodGet, "/readyz?verbose&exclude=non_learner")
	for _, want := range []string{"[+]data_corruption ok", "[+]serializable_read ok", "[+]linearizable_read ok", "ok\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("verbose /readyz lacks %q: %q", want, body)
		}
	}
	if strings.Contains(body, "non_learner") {
		t.Errorf("excluded check ran: %q", body)
	}
	f.alarm.Store(int32(pb.AlarmType_CORRUPT))
	if code, body := get(t, srv, http.MethodGet, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]data_corruption failed: alarm activated: CORRUPT") {
		t.Errorf("corrupt /readyz: %d %q", code, body)
	}
	if code, _ := get(t, srv, http.MethodGet, "/livez"); code != http.StatusOK {
		t.Errorf("/livez does not check corruption: %d", code)
	}
	f.ready.Store(false)
	if code, _ := get(t, srv, http.MethodGet, "/livez"); code != http.StatusServiceUnavailable {
		t.Errorf("/livez before ready: %d", code)
	}

	code, body := get(t, srv, http.MethodGet, "/version")
	if code != http.StatusOK || body != `{"etcdserver":"3.7.3","etcdcluster":"3.7.0","storage":"3.7.0"}` {
		t.Errorf("/version: %d %q", code, body)
	}
}
