package console_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/console"
	"github.com/aethermesh/aether/internal/cli"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// The console's tests run Debian's chromium, headless, driven over the
// DevTools protocol by chromedp, against a real registrar on a real etcd:
// what an operator's browser would do, assets, script, server-sent
// events and all.

// liveBound is how soon a change must show on an open page. The page
// learns of it from its event stream at once and re-reads the view (two
// small requests); the bound leaves room for a loaded 2-core machine
// under the race detector.
const liveBound = 5 * time.Second

// chromium is the browser, or the test fails saying how to install it
// (as the metrics lint treats promtool): a browser test that skips
// itself silently proves nothing.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("chromium not found on PATH: install it, e.g. apt-get install -y chromium (Debian's package; .ci/run installs it)")
	return ""
}

// browser starts a fresh headless chromium (its own empty profile) and
// returns a tab's context, bounded by d; everything ends with the test.
// extra adds flags.
func browser(t *testing.T, d time.Duration, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // the tests run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		// This machine's network is closed: no background fetches.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, d)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc() // waits for the browser process to exit
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", chromium(t), err)
	}
	return ctx
}

// artifacts is where screenshots go: $AETHER_ARTIFACTS when set (CI keeps
// it), else a directory of the test's.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("AETHER_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func screenshot(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", path, len(png))
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// waitPage polls js (an expression yielding a string) in the page until
// it equals want, failing after d with what it last was; it returns how
// long that took.
func waitPage(t *testing.T, ctx context.Context, what string, d time.Duration, js, want string) time.Duration {
	t.Helper()
	start := time.Now()
	var got string
	for {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err == nil {
			got = v
			if got == want {
				return time.Since(start)
			}
		} else {
			got = "error: " + err.Error()
		}
		if time.Since(start) > d {
			t.Fatalf("%s: after %s the page shows %q, want %q (%s)", what, d, got, want, js)
		}
		// A poll step of the condition, not a stand-in for it.
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// text is the expression for an element's text ("" when absent).
func text(sel string) string {
	return fmt.Sprintf(`(document.querySelector(%q)||{}).textContent||""`, sel)
}

// count is the expression for how many elements match, as a string.
func count(sel string) string {
	return fmt.Sprintf(`String(document.querySelectorAll(%q).length)`, sel)
}

// aether runs the CLI in-process, as an operator would run it.
func aether(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	root := cli.NewRoot(&out, &errb)
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("aether %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// plane starts a registrar in eu-west/c1 on a real etcd with two nodes
// and four endpoints: web on both nodes and a third (draining) in another
// zone, api on node-a.
func plane(t *testing.T, mut ...func(*server.Config)) *server.Server {
	t.Helper()
	etcd := etcdtest.Start(t)
	// The nodes send no heartbeats: a node TTL longer than any test keeps
	// them (and their endpoints) for its whole run.
	o := server.Config{EtcdEndpoints: etcd.Endpoints(), Options: registrar.Options{ClusterName: "c1", Region: "eu-west", Zone: "eu-west-1a",
		NodeTTL: 10 * time.Minute}}
	for _, m := range mut {
		m(&o)
	}
	srv := regtest.Start(t, o)
	r := srv.Registrar()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range []*registryv1.Node{
		{Name: "node-a", Zone: "eu-west-1a", Address: "10.0.0.1"},
		{Name: "node-b", Zone: "eu-west-1b", Address: "10.0.1.1"},
	} {
		if _, err := r.AnnounceNode(ctx, n); err != nil {
			t.Fatalf("announce %s: %v", n.Name, err)
		}
	}
	for _, e := range []struct {
		svc, ip, node, zone string
		drain               bool
	}{
		{"web", "10.0.0.11", "node-a", "eu-west-1a", false},
		{"web", "10.0.1.11", "node-b", "eu-west-1b", false},
		{"web", "10.0.1.12", "node-b", "eu-west-1b", true},
		{"api", "10.0.0.21", "node-a", "eu-west-1a", false},
	} {
		ep := regtest.EP(e.svc, e.ip, 8080)
		ep.Node, ep.Zone = e.node, e.zone
		if e.drain {
			ep.State = registryv1.State_STATE_DRAINING
		}
		if _, _, err := r.Register(ep); err != nil {
			t.Fatalf("register %s %s: %v", e.svc, e.ip, err)
		}
	}
	return srv
}

// TestConsoleInBrowser loads the page in a real browser, checks the
// counts and rows it shows, then registers, drains and removes an
// endpoint with the CLI and checks that the open page shows each change
// within liveBound, without a reload.
func TestConsoleInBrowser(t *testing.T) {
	srv := plane(t)
	base := "http://" + srv.HTTPAddr() + "/ui/"
	art := artifacts(t)
	ctx := browser(t, 2*time.Minute)

	if err := chromedp.Do(ctx, chromedp.Navigate(base)); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "endpoints", liveBound, text("#total-endpoints"), "4")
	for sel, want := range map[string]string{
		"#total-services": "2", "#total-serving": "3", "#total-draining": "1", "#total-nodes": "2",
		"#ready": "READY", "#live": "live", "#backend-kind": "etcd", "#backend-stuck": "no",
		`#regions tr[data-region="eu-west"][data-cluster="c1"] td:nth-child(3)`: "4",
		`#regions tr[data-region="eu-west"][data-cluster="c1"] td:nth-child(6)`: "2",
		count("#regions tbody tr"): "1",
	} {
		js := text(sel)
		if strings.HasPrefix(sel, "String(") {
			js = sel
		}
		waitPage(t, ctx, "overview "+sel, liveBound, js, want)
	}

	// A marker only this load of the page has: still there at the end,
	// no reload happened.
	eval[bool](t, ctx, `window.__sameLoad = true`)

	// Services: the list, its per-locality counts, the search.
	eval[bool](t, ctx, `(location.hash = "#/services", true)`)
	waitPage(t, ctx, "services rows", liveBound, count("#services tbody tr"), "2")
	waitPage(t, ctx, "web's localities", liveBound, text(`#services tr[data-service="web"] td:nth-child(6)`),
		"eu-west/eu-west-1a: 1 serving, 0 drainingeu-west/eu-west-1b: 1 serving, 1 draining")
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#search"), "ap")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "search 'ap'", liveBound, count("#services tbody tr"), "1")
	waitPage(t, ctx, "search 'ap' row", liveBound, `document.querySelector("#services tbody tr").dataset.service`, "api")
	// A new service that matches joins the filtered list live, and the
	// search box keeps its text and focus through the update.
	aether(t, "register", "--registrar="+srv.GRPCAddr(), "--service", "apex", "--ip", "10.0.3.1", "--port", "8080")
	waitPage(t, ctx, "apex joins the search", liveBound, `[...document.querySelectorAll("#services tbody tr")].map(r => r.dataset.service).join(",")`, "apex,api")
	waitPage(t, ctx, "search box kept", liveBound, `document.activeElement.id + "=" + document.activeElement.value`, "search=ap")

	// A service's endpoints.
	eval[bool](t, ctx, `(location.hash = "#/services/web", true)`)
	waitPage(t, ctx, "web's endpoints", liveBound, count("#endpoints tbody tr"), "3")
	row := func(ip string) string { return fmt.Sprintf(`#endpoints tr[data-endpoint=%q]`, ip) }
	waitPage(t, ctx, "10.0.1.12 state", liveBound, text(row("10.0.1.12")+" td:nth-child(4)"), "DRAINING")
	waitPage(t, ctx, "10.0.1.12 node", liveBound, text(row("10.0.1.12")+" td:nth-child(5)"), "node-b")
	waitPage(t, ctx, "10.0.1.12 zone", liveBound, text(row("10.0.1.12")+" td:nth-child(8)"), "eu-west-1b")
	waitPage(t, ctx, "10.0.1.12 weight", liveBound, text(row("10.0.1.12")+" td:nth-child(9)"), "1")

	// Live: each change through the CLI shows without a reload. The
	// events counted so far, once the console has caught up with the
	// replica's stream (the plane's writes may have come before it
	// subscribed, in its snapshot, or after, as events).
	var before uint64
	waitFor(t, "console caught up", liveBound, func() bool {
		ov := overview(t, "http://"+srv.HTTPAddr())
		before = ov.Events.Total
		return ov.Events.Version == ov.Replica.Version
	})
	reg := "--registrar=" + srv.GRPCAddr()
	aether(t, "register", reg, "--service", "web", "--ip", "10.0.2.99", "--port", "8080")
	took := waitPage(t, ctx, "registered endpoint appears", liveBound, text(row("10.0.2.99")+" td:nth-child(4)"), "SERVING")
	t.Logf("register shown after %s", took)
	waitPage(t, ctx, "summary after register", liveBound, text("#service-summary"), "4 endpoints: 3 serving, 1 draining")

	aether(t, "drain", reg, "--service", "web", "--ip", "10.0.2.99")
	took = waitPage(t, ctx, "drained endpoint", liveBound, text(row("10.0.2.99")+" td:nth-child(4)"), "DRAINING")
	t.Logf("drain shown after %s", took)
	screenshot(t, ctx, filepath.Join(art, "console-service.png"))

	aether(t, "deregister", reg, "--service", "web", "--ip", "10.0.2.99")
	took = waitPage(t, ctx, "removed endpoint", liveBound, count(row("10.0.2.99")), "0")
	t.Logf("deregister shown after %s", took)
	waitPage(t, ctx, "rows after removal", liveBound, count("#endpoints tbody tr"), "3")

	// Nodes: site, health, heartbeat age and lease remaining (asked of
	// etcd: a number, not "-").
	eval[bool](t, ctx, `(location.hash = "#/nodes", true)`)
	waitPage(t, ctx, "node rows", liveBound, count("#nodes-table tbody tr"), "2")
	waitPage(t, ctx, "node-b site", liveBound, text(`#nodes-table tr[data-node="node-b"] td:nth-child(4)`), "eu-west-1b")
	waitPage(t, ctx, "node-b held", liveBound, text(`#nodes-table tr[data-node="node-b"] td:nth-child(7)`), "1/2")
	waitPage(t, ctx, "node-a lease remaining shown", liveBound,
		`String(/^[0-9.]+(ms|s|m)$/.test(document.querySelector('#nodes-table tr[data-node="node-a"] td:nth-child(9)').textContent))`, "true")

	// The events chart counted the three changes.
	eval[bool](t, ctx, `(location.hash = "#/overview", true)`)
	waitPage(t, ctx, "events total", liveBound, text("#events-total"), strconv.FormatUint(before+3, 10))
	waitPage(t, ctx, "chart drawn", liveBound, count("#rate-chart polyline"), "1")
	// Some second of the last five minutes rises above the baseline (y 96).
	waitPage(t, ctx, "chart shows the events", liveBound,
		`String(document.querySelector("#rate-chart polyline").getAttribute("points").split(" ").some(p => parseFloat(p.split(",")[1]) < 95.9))`, "true")
	screenshot(t, ctx, filepath.Join(art, "console-overview.png"))

	if !eval[bool](t, ctx, `window.__sameLoad === true`) {
		t.Fatal("the page was reloaded: the marker set after the first load is gone")
	}
	if os.Getenv("AETHER_ARTIFACTS") != "" {
		t.Logf("screenshots in %s", art)
	}
}

// overview reads the JSON model, as `aether status` does.
func overview(t *testing.T, base string) console.Overview {
	t.Helper()
	resp, err := http.Get(base + console.OverviewPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ov console.Overview
	if err := json.NewDecoder(resp.Body).Decode(&ov); err != nil {
		t.Fatalf("decode %s: %v", console.OverviewPath, err)
	}
	return ov
}

var waitFor = wait.For

// spki is chromium's --ignore-certificate-errors-spki-list entry for a
// certificate: base64 SHA-256 of its public key. The browser then trusts
// exactly that certificate, not any.
func spki(t *testing.T, certFile string) string {
	t.Helper()
	raw, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(raw)
	if b == nil {
		t.Fatalf("%s: no PEM", certFile)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

func localhost(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return "localhost:" + port // the server certificate's name
}

// TestConsoleTLS: with --tls-cert the page is served over TLS and renders.
func TestConsoleTLS(t *testing.T) {
	m := meshtest.New(t, "example.org")
	srv := plane(t, func(o *server.Config) { o.TLSCertFile, o.TLSKeyFile = m.ServerCert, m.ServerKey })
	ctx := browser(t, time.Minute, chromedp.Flag("ignore-certificate-errors-spki-list", spki(t, m.ServerCert)))
	if err := chromedp.Do(ctx, chromedp.Navigate("https://"+localhost(t, srv.HTTPAddr())+"/ui/")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "endpoints over TLS", liveBound, text("#total-endpoints"), "4")
	waitPage(t, ctx, "event stream over TLS", liveBound, text("#live"), "live")
	if got := eval[string](t, ctx, `location.protocol`); got != "https:" {
		t.Fatalf("page loaded over %s", got)
	}
	// Plain HTTP to the TLS port gets nowhere.
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/ui/")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "Aether console") {
			t.Fatal("the console answered plaintext HTTP on the TLS port")
		}
	}
}

// TestConsoleMTLS: with --tls-client-ca the console is for operators. A
// browser without a client certificate is refused (and sees why); an
// operator's certificate is let in, a node's is not; the probes on the
// same port still need none.
func TestConsoleMTLS(t *testing.T) {
	m := meshtest.New(t, "example.org")
	srv := plane(t, func(o *server.Config) {
		o.TLSCertFile, o.TLSKeyFile, o.TLSClientCAFile, o.TrustDomain = m.ServerCert, m.ServerKey, m.CA, "example.org"
	})
	host := localhost(t, srv.HTTPAddr())

	ctx := browser(t, time.Minute, chromedp.Flag("ignore-certificate-errors-spki-list", spki(t, m.ServerCert)))
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse("https://"+host+"/ui/"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusUnauthorized {
		t.Fatalf("browser without a client certificate: status %d, want 401", resp.Status)
	}
	body := eval[string](t, ctx, `document.body.innerText`)
	if !strings.Contains(body, "needs a client certificate of an operator") {
		t.Fatalf("refusal page says %q", body)
	}
	if n := eval[float64](t, ctx, `document.querySelectorAll("#total-endpoints").length`); n != 0 {
		t.Fatal("the refused browser got the console")
	}

	get := func(cert string, path string) int {
		t.Helper()
		var pair [2]string // none
		if cert != "" {
			pair = m.Certs[cert]
		}
		cfg, err := pki.ClientTLSConfig(m.CA, pair[0], pair[1])
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{TLSClientConfig: cfg}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + host + path)
		if err != nil {
			t.Fatalf("GET %s as %q: %v", path, cert, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		cert, path string
		want       int
	}{
		{"operator-alice", "/ui/", http.StatusOK},
		{"operator-alice", "/ui/api/overview", http.StatusOK},
		{"node-node-a", "/ui/api/overview", http.StatusForbidden},
		{"", "/ui/api/overview", http.StatusUnauthorized},
		{"", "/ui/api/events", http.StatusUnauthorized},
		{"", "/healthz", http.StatusOK}, // probes need no certificate
		{"", "/readyz", http.StatusOK},
	} {
		if got := get(c.cert, c.path); got != c.want {
			t.Errorf("GET %s with %q: %d, want %d", c.path, c.cert, got, c.want)
		}
	}

	// A certificate of another CA fails the handshake itself.
	other := meshtest.New(t, "example.org")
	cfg, err := pki.ClientTLSConfig(m.CA, other.Certs["operator-alice"][0], other.Certs["operator-alice"][1])
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", host, cfg)
	if err == nil {
		err = conn.Handshake()
		if err == nil {
			// TLS 1.3: the server's verdict on the client certificate
			// arrives with the first read.
			_, err = conn.Read(make([]byte, 1))
		}
		conn.Close()
	}
	if err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
}

// TestConsoleReadOnly: nothing but GET and HEAD.
func TestConsoleReadOnly(t *testing.T) {
	srv := plane(t)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		req, _ := http.NewRequest(method, "http://"+srv.HTTPAddr()+"/ui/api/overview", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d, want 405", method, resp.StatusCode)
		}
	}
}

// TestConsoleXDSClients: with the xDS feed on, a real grpc-go xDS client
// shows on the xDS page with its node and SYNCED on all four types, and
// in the overview's summary.
func TestConsoleXDSClients(t *testing.T) {
	srv := plane(t, func(o *server.Config) { o.XDSAddr = "127.0.0.1:0" })
	b := xdstest.StartBackends(t, 1)[0]
	if _, _, err := srv.Registrar().Register(&registryv1.ServiceEndpoint{Service: "grpc-web", Protocol: registryv1.Protocol_PROTOCOL_GRPC,
		Ip: b.Host(), Ports: []*registryv1.Port{{Name: "grpc", Port: b.Port()}}, Zone: "eu-west-1a"}); err != nil {
		t.Fatal(err)
	}
	cc := xdstest.Client(t, "grpc-web", xdstest.Bootstrap(srv.XDSAddr(), "console-node", xdstest.Locality{Region: "eu-west", Zone: "eu-west-1a"}))
	xdstest.WaitSpread(t, cc, xdstest.Only(b), 20*time.Second)

	ctx := browser(t, time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+srv.HTTPAddr()+"/ui/#/xds")); err != nil {
		t.Fatal(err)
	}
	row := `#xds-table tr[data-xds-node="console-node"]`
	waitPage(t, ctx, "xDS client row", liveBound, count(row), "1")
	for i, typ := range []string{"CDS", "EDS", "LDS", "RDS"} {
		waitPage(t, ctx, typ+" state", liveBound,
			fmt.Sprintf(`(document.querySelector('%s td:nth-child(%d)')||{}).className||""`, row, i+3), "SYNCED")
	}
	eval[bool](t, ctx, `(location.hash = "#/overview", true)`)
	waitPage(t, ctx, "xDS summary", liveBound, text("#xds-summary"), "1 clients: 1 synced, 0 stale, 0 nacked")
}
