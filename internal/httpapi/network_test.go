package httpapi

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// fakeNetwork records what the manager asks of a sandbox network; the
// real one (package netpolicy) needs root and is tested through the SDK.
type fakeNetwork struct {
	mu  sync.Mutex
	all []*fakeAttachment
}

type fakeAttachment struct {
	mu     sync.Mutex
	id     string
	pol    policy.Network
	ns     *os.File
	closed bool
}

func (n *fakeNetwork) Attach(_ context.Context, id string, pol policy.Network) (sandbox.NetAttachment, error) {
	ns, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	a := &fakeAttachment{id: id, pol: pol, ns: ns}
	n.mu.Lock()
	n.all = append(n.all, a)
	n.mu.Unlock()
	return a, nil
}

func (n *fakeNetwork) last(t *testing.T) *fakeAttachment {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.all) == 0 {
		t.Fatal("no network was attached")
	}
	return n.all[len(n.all)-1]
}

func (a *fakeAttachment) Namespace() *os.File { return a.ns }
func (a *fakeAttachment) Name(string)         {}
func (a *fakeAttachment) Policy() policy.Network {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pol
}
func (a *fakeAttachment) Update(p policy.Network) error {
	if err := p.Validate(); err != nil {
		return err
	}
	a.mu.Lock()
	a.pol = p
	a.mu.Unlock()
	return nil
}
func (a *fakeAttachment) Close() error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	return a.ns.Close()
}

func TestNetworkCreateInfoUpdate(t *testing.T) {
	nw := &fakeNetwork{}
	a := newAPI(t, sandbox.Config{Network: nw})
	c := a.create(map[string]any{"allow_internet_access": true, "network": map[string]any{
		"denyOut": []string{"203.0.113.0/24", "Evil.Example."}, "allowPublicTraffic": false}})
	att := nw.last(t)
	want := policy.Network{Mode: policy.NetInternet,
		DenyOut: []policy.Rule{{Prefix: mustPrefix("203.0.113.0/24")}, {Name: "evil.example"}}}
	if got := att.Policy(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("attached %+v, want %+v", got, want)
	}
	if inst := a.b.Instances(); inst[len(inst)-1].NetNS() != att.ns {
		t.Error("the sandbox was not started in its network's namespace (a pooled one?)")
	}

	var got struct {
		AllowInternetAccess bool        `json:"allowInternetAccess"`
		Network             networkInfo `json:"network"`
	}
	code, data := a.call("GET", "/sandboxes/"+c.SandboxID, nil)
	if code != http.StatusOK || json.Unmarshal(data, &got) != nil {
		t.Fatalf("get: %d %s", code, data)
	}
	if !got.AllowInternetAccess || got.Network.AllowPublicTraffic || strings.Join(got.Network.DenyOut, " ") != "203.0.113.0/24 evil.example" {
		t.Errorf("getInfo said %s", data)
	}

	// An update replaces everything; allowOut alone is an allowlist.
	code, data = a.call("PUT", "/sandboxes/"+c.SandboxID+"/network", `{"allowOut":["*.pypi.org","10.1.2.3"]}`)
	if code != http.StatusNoContent {
		t.Fatalf("update: %d %s", code, data)
	}
	if p := att.Policy(); p.Mode != policy.NetFiltered || len(p.DenyOut) != 0 || fmt.Sprint(policy.Strings(p.AllowOut)) != "[*.pypi.org 10.1.2.3]" {
		t.Errorf("after the update: %+v", p)
	}
	// Closed to everything, but the interface stays.
	if code, data = a.call("PUT", "/sandboxes/"+c.SandboxID+"/network", `{}`); code != http.StatusNoContent {
		t.Fatalf("update to nothing: %d %s", code, data)
	}
	if p := att.Policy(); p.Mode != policy.NetFiltered || len(p.AllowOut) != 0 {
		t.Errorf("after the update to nothing: %+v", p)
	}
	if code, data = a.call("PUT", "/sandboxes/"+c.SandboxID+"/network", `{"allowOut":["not a name"]}`); code != http.StatusBadRequest {
		t.Errorf("bad update: %d %s", code, data)
	}

	if code, _ := a.call("DELETE", "/sandboxes/"+c.SandboxID, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	att.mu.Lock()
	closed := att.closed
	att.mu.Unlock()
	if !closed {
		t.Error("the network outlived its sandbox")
	}

	// An empty allowOut still makes an interface, closed, to open later.
	a.create(map[string]any{"network": map[string]any{"allowOut": []string{}}})
	if p := nw.last(t).Policy(); p.Mode != policy.NetFiltered {
		t.Errorf("an empty allowOut made %+v", p)
	}
}

func mustPrefix(s string) netip.Prefix {
	r, err := policy.ParseRule(s)
	if err != nil {
		panic(err)
	}
	return r.Prefix
}

// serverIn starts a server on the test's loopback, where the fake
// backend's agent (in-process) finds it: it answers with what it got.
func serverIn(t *testing.T, tls bool) (port string) {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			c, brw, _ := http.NewResponseController(w).Hijack()
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			line, _ := brw.ReadString('\n')
			brw.WriteString("echo " + line)
			brw.Flush()
			return
		}
		fmt.Fprintf(w, "host=%s path=%s token=%q sandbox=%q authorization=%q api-key=%q", r.Host, r.URL.Path,
			r.Header.Get("X-Access-Token")+r.Header.Get("E2B-Traffic-Access-Token"), r.Header.Get("E2b-Sandbox-Id"),
			r.Header.Values("Authorization"), r.Header.Get("X-Api-Key"))
	})
	srv := httptest.NewUnstartedServer(h)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u.Port()
}

func TestPortGateway(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	port := serverIn(t, false)
	c := a.create(map[string]any{})
	get := func(hdr http.Header) (int, string) {
		t.Helper()
		code, _, data := a.do("GET", "/some/path", nil, hdr)
		return code, string(data)
	}

	code, body := get(http.Header{"E2b-Sandbox-Id": {c.SandboxID}, "E2b-Sandbox-Port": {port}, "X-Access-Token": {c.EnvdAccessToken}})
	if code != http.StatusOK || !strings.Contains(body, "path=/some/path") || !strings.Contains(body, `token="" sandbox=""`) {
		t.Errorf("by header: %d %s", code, body)
	}
	// getHost's form; the server sees the host the client asked for.
	host := port + "-" + c.SandboxID + ".localhost:49982"
	code, body = get(http.Header{"Host": {host}})
	if code != http.StatusOK || !strings.Contains(body, "host="+host) {
		t.Errorf("by host %s: %d %s", host, code, body)
	}
	if code, body = get(http.Header{"Host": {"1-" + c.SandboxID + ".localhost"}}); code != http.StatusBadGateway || !strings.Contains(body, "no server listens on port 1") {
		t.Errorf("a port nothing listens on: %d %s", code, body)
	}
	if code, body = get(http.Header{"Host": {port + "-nosuchsandbox.localhost"}}); code != http.StatusBadGateway {
		t.Errorf("no such sandbox: %d %s", code, body)
	}
	if code, body = get(http.Header{"E2b-Sandbox-Id": {c.SandboxID}, "E2b-Sandbox-Port": {"08080"}}); code != http.StatusBadRequest {
		t.Errorf("a malformed port: %d %s", code, body)
	}
	// Another domain is the control plane's business.
	if code, _ = get(http.Header{"Host": {port + "-" + c.SandboxID + ".example.com"}}); code != http.StatusNotFound {
		t.Errorf("another domain: %d", code)
	}

	// Private ports need the traffic token; maskRequestHost sets Host.
	p := a.create(map[string]any{"network": map[string]any{"allowPublicTraffic": false, "maskRequestHost": "localhost:${PORT}"}})
	host = port + "-" + p.SandboxID + ".localhost"
	if code, body = get(http.Header{"Host": {host}}); code != http.StatusUnauthorized {
		t.Errorf("private port without the token: %d %s", code, body)
	}
	if code, body = get(http.Header{"Host": {host}, "E2B-Traffic-Access-Token": {c.EnvdAccessToken}}); code != http.StatusUnauthorized {
		t.Errorf("private port with another token: %d %s", code, body)
	}
	code, body = get(http.Header{"Host": {host}, "E2B-Traffic-Access-Token": {*p.TrafficAccessToken}})
	if code != http.StatusOK || !strings.Contains(body, "host=localhost:"+port) || !strings.Contains(body, `token=""`) {
		t.Errorf("private port with its token: %d %s", code, body)
	}

	// Upgrades (websockets) pass through.
	conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s-%s.localhost\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", port, c.SandboxID)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprintf(conn, "hello\n")
	if line, _ := br.ReadString('\n'); line != "echo hello\n" {
		t.Errorf("through the upgraded connection: %q", line)
	}

	// A server that speaks TLS, listed in httpsPorts.
	tport := serverIn(t, true)
	var n int
	fmt.Sscan(tport, &n)
	s := a.create(map[string]any{"network": map[string]any{"httpsPorts": []int{n}}})
	code, body = get(http.Header{"Host": {tport + "-" + s.SandboxID + ".localhost"}})
	if code != http.StatusOK || !strings.Contains(body, "path=/some/path") {
		t.Errorf("TLS port: %d %s", code, body)
	}
}

// TestPortGatewayDropsCredentials: a server in the sandbox never sees the
// API key or the sandbox's tokens, however the client sent them; an
// Authorization of its own passes.
func TestPortGatewayDropsCredentials(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	port := serverIn(t, false)
	c := a.create(map[string]any{})
	secrets := []string{key, c.EnvdAccessToken, *c.TrafficAccessToken}
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	for name, hdr := range map[string]http.Header{
		"bearer key":           {"Authorization": {"Bearer " + key}},
		"bearer, lower case":   {"Authorization": {"bearer " + key}},
		"bare key":             {"Authorization": {key}},
		"key as a password":    {"Authorization": {basic("user", key)}},
		"access token":         {"Authorization": {"Bearer " + c.EnvdAccessToken}},
		"key header":           {"X-Api-Key": {key}},
		"two, one the key":     {"Authorization": {"Bearer app-token", "Bearer " + key}},
		"every header at once": {"Authorization": {"Bearer " + key}, "X-Api-Key": {key}, "X-Access-Token": {c.EnvdAccessToken}, "E2b-Traffic-Access-Token": {*c.TrafficAccessToken}},
	} {
		hdr.Set("Host", port+"-"+c.SandboxID+".localhost:49982")
		code, _, data := a.do("GET", "/echo", nil, hdr)
		if code != http.StatusOK || !strings.Contains(string(data), "path=/echo") {
			t.Fatalf("%s: %d %s", name, code, data)
		}
		for _, secret := range secrets {
			if strings.Contains(string(data), secret) {
				t.Errorf("%s: the sandbox's server got a credential: %s", name, data)
			}
		}
	}
	// The server's own credentials are its business.
	hdr := http.Header{"Host": {port + "-" + c.SandboxID + ".localhost:49982"}, "Authorization": {"Bearer app-token"}}
	if code, _, data := a.do("GET", "/echo", nil, hdr); code != http.StatusOK || !strings.Contains(string(data), `authorization=["Bearer app-token"]`) {
		t.Errorf("an Authorization of the sandbox's own: %d %s, want it passed on", code, data)
	}
}

// attached is the policy sandbox id's network has, or false if it has no
// interface (no attachment made since the count before).
func (n *fakeNetwork) policyOf(before int) (policy.Network, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.all) == before {
		return policy.Network{}, false
	}
	return n.all[len(n.all)-1].Policy(), true
}

func (n *fakeNetwork) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.all)
}

// E2B's rules on an open server: the internet unless allowInternetAccess
// is false, denyOut alone the internet less it, ALL_TRAFFIC as E2B
// means it, and every sandbox with an interface, so that updateNetwork
// works both ways.
func TestNetworkByE2BRules(t *testing.T) {
	nw := &fakeNetwork{}
	a := newAPI(t, sandbox.Config{Network: nw})
	a.s.SetNetworkDefault(NetDefault{Internet: true})
	for _, tc := range []struct {
		name, body, want string // want: mode, then allowOut, then denyOut
	}{
		{"nothing said", `{}`, "internet [] []"},
		{"an empty network", `{"network": {}}`, "internet [] []"},
		{"allowInternetAccess", `{"allow_internet_access": true}`, "internet [] []"},
		{"sealed", `{"allow_internet_access": false}`, "filtered [] []"},
		{"sealed, allowOut kept", `{"allow_internet_access": false, "network": {"allowOut": ["allowed.test"], "denyOut": ["203.0.113.0/24"]}}`, "filtered [allowed.test] []"},
		{"denyOut alone", `{"network": {"denyOut": ["203.0.113.20"]}}`, "internet [] [203.0.113.20]"},
		{"E2B's allowlist recipe", `{"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["allowed.test"]}}`, "internet [allowed.test] [0.0.0.0/0]"},
		{"allowOut alone (Airlock's allowlist)", `{"network": {"allowOut": ["allowed.test"]}}`, "filtered [allowed.test] []"},
		{"ALL_TRAFFIC allowed over denied", `{"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["0.0.0.0/0"]}}`, "internet [0.0.0.0/0] [0.0.0.0/0]"},
	} {
		before := nw.count()
		code, data := a.call("POST", "/v2/sandboxes", tc.body)
		if code != http.StatusCreated {
			t.Errorf("%s: %d %s", tc.name, code, data)
			continue
		}
		p, ok := nw.policyOf(before)
		if got := fmt.Sprintf("%s %v %v", p.Mode, policy.Strings(p.AllowOut), policy.Strings(p.DenyOut)); !ok || got != tc.want {
			t.Errorf("%s: interface %v, policy %s, want %s", tc.name, ok, got, tc.want)
		}
	}

	// updateNetwork, sealed → open → sealed, and E2B's updateNetwork({})
	// clearing every rule: the internet.
	c := a.create(map[string]any{"allow_internet_access": false})
	att := nw.last(t)
	for _, step := range []struct{ body, want string }{
		{`{"allow_internet_access": true}`, "internet"},
		{`{"allow_internet_access": false}`, "filtered"},
		{`{}`, "internet"},
		{`{"denyOut": ["0.0.0.0/0"]}`, "internet"},
		{`{"allowOut": []}`, "filtered"},
	} {
		if code, data := a.call("PUT", "/sandboxes/"+c.SandboxID+"/network", step.body); code != http.StatusNoContent {
			t.Fatalf("update %s: %d %s", step.body, code, data)
		}
		if p := att.Policy(); string(p.Mode) != step.want {
			t.Errorf("after update %s: %s, want %s", step.body, p.Mode, step.want)
		}
	}
	var info struct {
		AllowInternetAccess *bool `json:"allowInternetAccess"`
	}
	_, data := a.call("GET", "/sandboxes/"+c.SandboxID, nil)
	if json.Unmarshal(data, &info) != nil || info.AllowInternetAccess == nil || *info.AllowInternetAccess {
		t.Errorf("getInfo of a sealed sandbox: %s", data)
	}
}

// A sealed server (network.default "none"): no interface unless asked
// for by allowOut, and a request for the internet is refused naming the
// setting, at create and at update.
func TestNetworkSealedServer(t *testing.T) {
	nw := &fakeNetwork{}
	a := newAPI(t, sandbox.Config{Network: nw})
	a.s.SetNetworkDefault(NetDefault{SealedBy: `network.default "none"`})
	for _, body := range []string{`{}`, `{"allow_internet_access": false}`} {
		before := nw.count()
		a.create(body)
		if p, ok := nw.policyOf(before); ok {
			t.Errorf("%s on a sealed server made an interface: %+v", body, p)
		}
	}
	for _, body := range []string{
		`{"allow_internet_access": true}`,
		`{"network": {"denyOut": ["203.0.113.20"]}}`,
		`{"network": {"allowOut": ["0.0.0.0/0"]}}`,
		`{"allow_internet_access": false, "network": {"allowOut": ["0.0.0.0/0"]}}`,
	} {
		code, data := a.call("POST", "/v2/sandboxes", body)
		if code != http.StatusBadRequest || !strings.Contains(string(data), `network.default \"none\"`) {
			t.Errorf("%s on a sealed server: %d %s, want 400 naming network.default", body, code, data)
		}
	}
	// Allowlists are not the internet.
	for _, body := range []string{
		`{"network": {"allowOut": ["allowed.test"]}}`,
		`{"allow_internet_access": true, "network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["allowed.test"]}}`,
	} {
		before := nw.count()
		a.create(body)
		if p, ok := nw.policyOf(before); !ok || p.OpenInternet() {
			t.Errorf("%s on a sealed server: interface %v, %+v", body, ok, p)
		}
	}
	c := a.create(`{"network": {"allowOut": ["allowed.test"]}}`)
	att := nw.last(t)
	if code, data := a.call("PUT", "/sandboxes/"+c.SandboxID+"/network", `{"allow_internet_access": true}`); code != http.StatusBadRequest || !strings.Contains(string(data), "network.default") {
		t.Errorf("the internet by update on a sealed server: %d %s", code, data)
	}
	if code, data := a.call("PUT", "/sandboxes/"+c.SandboxID+"/network", `{}`); code != http.StatusNoContent || att.Policy().Mode != policy.NetFiltered || len(att.Policy().AllowOut) != 0 {
		t.Errorf("update to nothing on a sealed server: %d %s, %+v, want closed", code, data, att.Policy())
	}
}
