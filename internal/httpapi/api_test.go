package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

const key = "e2b_test_key"

// api is a Server on a real Manager over the fake backend.
type api struct {
	t   *testing.T
	url string
	m   *sandbox.Manager
	b   *fake.Backend
	s   *Server
}

func newAPI(t *testing.T, cfg sandbox.Config) *api {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	b := fake.New(t.TempDir(), log)
	b.SetMemory(20 << 20)
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = time.Minute
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = time.Hour
	}
	cfg.Templates = []sandbox.Template{{Name: "base", Policy: policy.Default()}}
	m := sandbox.NewManager(cfg, b, log)
	t.Cleanup(m.Shutdown)
	s := New(m, key, "localhost:49982", log)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &api{t: t, url: srv.URL, m: m, b: b, s: s}
}

// do sends a request with body (a string is sent as it is, anything else
// as JSON) and returns the status, the headers and the body.
func (a *api) do(method, path string, body any, hdr http.Header) (int, http.Header, []byte) {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(a.t.Context(), method, a.url+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if rd != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v[0]
			continue
		}
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// call is do with the API key.
func (a *api) call(method, path string, body any) (int, []byte) {
	a.t.Helper()
	code, _, data := a.do(method, path, body, http.Header{"X-Api-Key": {key}})
	return code, data
}

type created struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
}

func (a *api) create(body any) created {
	a.t.Helper()
	code, data := a.call("POST", "/v2/sandboxes", body)
	if code != http.StatusCreated {
		a.t.Fatalf("create: %d %s", code, data)
	}
	var c created
	if err := json.Unmarshal(data, &c); err != nil {
		a.t.Fatalf("create answered %s: %v", data, err)
	}
	return c
}

type info struct {
	TemplateID          string            `json:"templateID"`
	SandboxID           string            `json:"sandboxID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	CPUCount            float64           `json:"cpuCount"`
	MemoryMB            int64             `json:"memoryMB"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	EnvdAccessToken     string            `json:"envdAccessToken"`
	AllowInternetAccess *bool             `json:"allowInternetAccess"`
}

func (a *api) info(id string) info {
	a.t.Helper()
	code, data := a.call("GET", "/sandboxes/"+id, nil)
	if code != http.StatusOK {
		a.t.Fatalf("get %s: %d %s", id, code, data)
	}
	var in info
	if err := json.Unmarshal(data, &in); err != nil {
		a.t.Fatal(err)
	}
	return in
}

// apiError decodes E2B's error body and checks that its code is status.
func apiError(t *testing.T, status int, data []byte) string {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("error body %q: %v", data, err)
	}
	if e.Code != status || e.Message == "" {
		t.Errorf("error body %s, want code %d and a message", data, status)
	}
	return e.Message
}

// gateway sends a request to a port of sandbox id through the gateway.
func (a *api) gateway(id, port, method, path string, hdr http.Header, body io.Reader) (int, []byte) {
	a.t.Helper()
	req, err := http.NewRequestWithContext(a.t.Context(), method, a.url+path, body)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v[0]
			continue
		}
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func envd(c created) http.Header { return http.Header{"X-Access-Token": {c.EnvdAccessToken}} }

func TestAuth(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	for _, tc := range []struct {
		name string
		hdr  http.Header
		want int
	}{
		{"no key", nil, http.StatusUnauthorized},
		{"wrong key", http.Header{"X-Api-Key": {"e2b_wrong"}}, http.StatusUnauthorized},
		{"empty key", http.Header{"X-Api-Key": {""}}, http.StatusUnauthorized},
		{"a prefix of the key", http.Header{"X-Api-Key": {key[:5]}}, http.StatusUnauthorized},
		{"wrong bearer", http.Header{"Authorization": {"Bearer nope"}}, http.StatusUnauthorized},
		{"basic, not bearer", http.Header{"Authorization": {"Basic " + key}}, http.StatusUnauthorized},
		{"X-API-KEY", http.Header{"X-Api-Key": {key}}, http.StatusOK},
		{"bearer", http.Header{"Authorization": {"Bearer " + key}}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, data := a.do("GET", "/v2/sandboxes", nil, tc.hdr)
			if code != tc.want {
				t.Fatalf("got %d %s, want %d", code, data, tc.want)
			}
			if code == http.StatusUnauthorized {
				apiError(t, code, data)
			}
		})
	}
	if code, _, data := a.do("GET", "/health", nil, nil); code != http.StatusOK {
		t.Errorf("/health without a key: %d %s, want 200", code, data)
	}
	// Every route of the control plane needs the key.
	for _, r := range []string{"POST /sandboxes", "POST /v2/sandboxes", "GET /sandboxes", "GET /sandboxes/x",
		"DELETE /sandboxes/x", "POST /sandboxes/x/timeout", "POST /sandboxes/x/connect", "POST /v2/sandboxes/x/connect",
		"POST /sandboxes/x/resume", "GET /sandboxes/x/metrics", "POST /sandboxes/x/pause", "GET /metrics"} {
		method, path, _ := strings.Cut(r, " ")
		if code, _, _ := a.do(method, path, nil, nil); code != http.StatusUnauthorized {
			t.Errorf("%s without a key: %d, want 401", r, code)
		}
	}
	if n := a.b.Starts(); n != 0 {
		t.Errorf("%d sandboxes started by unauthorized requests", n)
	}
}

func TestCreateGetListKill(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(map[string]any{"templateID": "base", "metadata": map[string]string{"user": "ada"}, "timeout": 120})
	if c.SandboxID == "" || c.TemplateID != "base" || c.ClientID == "" || c.EnvdVersion == "" || c.EnvdAccessToken == "" {
		t.Errorf("create answered %+v, want every field set", c)
	}
	if c.TrafficAccessToken == nil || *c.TrafficAccessToken == "" || *c.TrafficAccessToken == c.EnvdAccessToken {
		t.Errorf("traffic token %v, want one of its own", c.TrafficAccessToken)
	}

	in := a.info(c.SandboxID)
	if in.SandboxID != c.SandboxID || in.State != "running" || in.Metadata["user"] != "ada" || in.EnvdAccessToken != c.EnvdAccessToken {
		t.Errorf("get answered %+v", in)
	}
	if in.AllowInternetAccess == nil || *in.AllowInternetAccess {
		t.Errorf("allowInternetAccess %v, want false", in.AllowInternetAccess)
	}
	if d := in.EndAt.Sub(in.StartedAt); d < 119*time.Second || d > 121*time.Second {
		t.Errorf("endAt - startedAt = %v, want the 120 s asked for", d)
	}
	if in.CPUCount != 1 || in.MemoryMB != 512 {
		t.Errorf("cpuCount %g memoryMB %d, want the template's 1 and 512", in.CPUCount, in.MemoryMB)
	}

	// The old create route, and no body at all: the base template.
	old := created{}
	code, data := a.call("POST", "/sandboxes", nil)
	if code != http.StatusCreated || json.Unmarshal(data, &old) != nil || old.TemplateID != "base" {
		t.Fatalf("POST /sandboxes with no body: %d %s", code, data)
	}

	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		code, data := a.call("GET", path, nil)
		var items []info
		if code != http.StatusOK || json.Unmarshal(data, &items) != nil {
			t.Fatalf("list %s: %d %s", path, code, data)
		}
		if len(items) != 2 || items[0].SandboxID != old.SandboxID || items[1].SandboxID != c.SandboxID {
			t.Errorf("list %s: %s, want both, newest first", path, data)
		}
		if items[0].EnvdAccessToken != "" {
			t.Errorf("list %s shows an access token", path)
		}
	}

	if code, data := a.call("DELETE", "/sandboxes/"+c.SandboxID, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", code, data)
	}
	for _, r := range []string{"DELETE /sandboxes/", "GET /sandboxes/", "POST /sandboxes/%s/pause", "GET /sandboxes/%s/metrics"} {
		method, path, _ := strings.Cut(r, " ")
		if !strings.Contains(path, "%s") {
			path += "%s"
		}
		code, data := a.call(method, fmt.Sprintf(path, c.SandboxID), nil)
		if code != http.StatusNotFound {
			t.Errorf("%s of a killed sandbox: %d %s, want 404", method, code, data)
			continue
		}
		apiError(t, code, data)
	}
}

func TestTimeoutAndMetrics(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(map[string]any{"timeout": 60})
	if code, data := a.call("POST", "/sandboxes/"+c.SandboxID+"/timeout", map[string]any{"timeout": 600}); code != http.StatusNoContent {
		t.Fatalf("timeout: %d %s", code, data)
	}
	if in := a.info(c.SandboxID); time.Until(in.EndAt) < 5*time.Minute {
		t.Errorf("endAt %v after a timeout of 600 s", in.EndAt)
	}
	code, data := a.call("GET", "/sandboxes/"+c.SandboxID+"/metrics", nil)
	var ms []struct {
		CPUCount   float64 `json:"cpuCount"`
		CPUUsedPct float64 `json:"cpuUsedPct"`
		MemUsed    int64   `json:"memUsed"`
		MemTotal   int64   `json:"memTotal"`
		DiskTotal  int64   `json:"diskTotal"`
		Timestamp  int64   `json:"timestampUnix"`
	}
	if code != http.StatusOK || json.Unmarshal(data, &ms) != nil || len(ms) != 1 {
		t.Fatalf("metrics: %d %s", code, data)
	}
	// diskTotal is what its file systems hold: the default 1 GiB disk
	// bounded by the 512 MiB of memory (policy.WritableBytes).
	if m := ms[0]; m.MemUsed != 20<<20 || m.MemTotal != 512<<20 || m.CPUCount != 1 || m.DiskTotal != 384<<20 || m.Timestamp == 0 {
		t.Errorf("metrics %s", data)
	}
	_, body := a.call("GET", "/metrics", nil)
	for _, want := range []string{`airlock_sandboxes_running{template="base"} 1`, `airlock_sandbox_creates_total{source="cold"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestListFilters(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	x := a.create(map[string]any{"metadata": map[string]string{"team": "a b", "env": "prod"}})
	y := a.create(map[string]any{"metadata": map[string]string{"team": "a b"}})
	z := a.create(map[string]any{"metadata": map[string]string{"team": "c"}})
	if code, data := a.call("POST", "/sandboxes/"+y.SandboxID+"/pause", nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, data)
	}
	// The SDK encodes each key and value, then the whole filter.
	metadata := func(kv ...string) string {
		var parts []string
		for i := 0; i < len(kv); i += 2 {
			parts = append(parts, url.QueryEscape(kv[i])+"="+url.QueryEscape(kv[i+1]))
		}
		return "metadata=" + url.QueryEscape(strings.Join(parts, "&"))
	}
	for _, tc := range []struct {
		query string
		want  []created
	}{
		{"", []created{x, y, z}},
		{metadata("team", "a b"), []created{x, y}},
		{metadata("team", "a b", "env", "prod"), []created{x}},
		{metadata("team", "nobody"), nil},
		{"state=paused", []created{y}},
		{"state=running", []created{x, z}},
		{"state=running,paused", []created{x, y, z}},
		{"state=running&state=paused", []created{x, y, z}},
		{metadata("team", "a b") + "&state=running", []created{x}},
		{"template=base", []created{x, y, z}},
		{"template=other", nil},
		{"order=asc", []created{x, y, z}},
		{"order=asc&state=running", []created{x, z}},
	} {
		t.Run(tc.query, func(t *testing.T) {
			code, data := a.call("GET", "/v2/sandboxes?"+tc.query, nil)
			var items []info
			if code != http.StatusOK || json.Unmarshal(data, &items) != nil {
				t.Fatalf("%d %s", code, data)
			}
			if items == nil {
				t.Errorf("body %s, want a JSON array", data)
			}
			var got, want []string
			for _, it := range items {
				got = append(got, it.SandboxID)
			}
			for _, c := range tc.want {
				want = append(want, c.SandboxID)
			}
			// Newest first, as on E2B, unless asked otherwise.
			if !strings.Contains(tc.query, "order=asc") {
				slices.Reverse(want)
			}
			if !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

// page lists one page and returns its ids and the next page's token.
func (a *api) page(query string) ([]string, string) {
	a.t.Helper()
	code, hdr, data := a.do("GET", "/v2/sandboxes?"+query, nil, http.Header{"X-Api-Key": {key}})
	var items []info
	if code != http.StatusOK || json.Unmarshal(data, &items) != nil {
		a.t.Fatalf("list ?%s: %d %s", query, code, data)
	}
	var ids []string
	for _, it := range items {
		ids = append(ids, it.SandboxID)
	}
	return ids, hdr.Get("X-Next-Token")
}

func TestListPaging(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	var all []string
	for range 5 {
		all = append(all, a.create(nil).SandboxID)
	}
	for _, order := range []string{"", "&order=asc", "&order=desc"} {
		var got []string
		query := "limit=2" + order
		for pages := 0; ; pages++ {
			if pages > len(all) {
				t.Fatal("paging does not end")
			}
			ids, next := a.page(query)
			if len(ids) > 2 {
				t.Fatalf("page of %d, want at most 2", len(ids))
			}
			got = append(got, ids...)
			if next == "" {
				break
			}
			query = "limit=2" + order + "&nextToken=" + url.QueryEscape(next)
		}
		want := slices.Clone(all)
		if order != "&order=asc" {
			slices.Reverse(want) // newest first
		}
		if !slices.Equal(got, want) {
			t.Errorf("pages%s gave %v, want %v", order, got, want)
		}
	}
	// startedAfter: those started at or after a time.
	code, _, data := a.do("GET", "/sandboxes/"+all[2], nil, http.Header{"X-Api-Key": {key}})
	var third struct{ StartedAt time.Time }
	if code != http.StatusOK || json.Unmarshal(data, &third) != nil {
		t.Fatalf("get: %d %s", code, data)
	}
	if ids, _ := a.page("order=asc&startedAfter=" + url.QueryEscape(third.StartedAt.Format(time.RFC3339Nano))); !slices.Equal(ids, all[2:]) {
		t.Errorf("startedAfter the third: %v, want %v", ids, all[2:])
	}
	for _, bad := range []string{"order=up", "startedAfter=yesterday"} {
		if code, _, _ := a.do("GET", "/v2/sandboxes?"+bad, nil, http.Header{"X-Api-Key": {key}}); code != http.StatusBadRequest {
			t.Errorf("?%s: %d, want 400", bad, code)
		}
	}
	if ids, next := a.page("limit=5"); len(ids) != 5 || next != "" {
		t.Errorf("limit=5 of 5: %d items, next %q; want 5 and no next page", len(ids), next)
	}
	if ids, next := a.page("limit=100"); len(ids) != 5 || next != "" {
		t.Errorf("limit=100 of 5: %d items, next %q", len(ids), next)
	}
}

// A client that kills what it lists, page by page, must still reach
// every page: the token of a page must not depend on its last sandbox
// still being there.
func TestListPagingWhileKilling(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	for range 5 {
		a.create(nil)
	}
	killed, query := 0, "limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		ids, next := a.page(query)
		for _, id := range ids {
			if code, data := a.call("DELETE", "/sandboxes/"+id, nil); code != http.StatusNoContent {
				t.Fatalf("kill: %d %s", code, data)
			}
			killed++
		}
		if next == "" {
			break
		}
		query = "limit=2&nextToken=" + url.QueryEscape(next)
	}
	if killed != 5 {
		t.Errorf("killed %d sandboxes page by page, want all 5", killed)
	}
}

func TestBadInput(t *testing.T) {
	a := newAPI(t, sandbox.Config{MaxTTL: time.Hour})
	c := a.create(nil)
	id := c.SandboxID
	for _, tc := range []struct {
		name, method, path string
		body               any
		want               int
		mention            string // the message names this
	}{
		{"bad JSON", "POST", "/v2/sandboxes", `{"templateID":`, 400, "JSON"},
		{"not an object", "POST", "/v2/sandboxes", `[1]`, 400, "JSON"},
		{"timeout of the wrong type", "POST", "/v2/sandboxes", `{"timeout":"60"}`, 400, "timeout"},
		{"metadata of the wrong type", "POST", "/v2/sandboxes", `{"metadata":{"a":1}}`, 400, "metadata"},
		{"zero timeout", "POST", "/v2/sandboxes", `{"timeout":0}`, 400, "timeout"},
		{"negative timeout", "POST", "/v2/sandboxes", `{"timeout":-5}`, 400, "timeout"},
		{"timeout above the maximum", "POST", "/v2/sandboxes", `{"timeout":7200}`, 400, "timeout"},
		// 2^64 ns and a little more: wrapped around to 0.29 s.
		{"timeout past a Duration", "POST", "/v2/sandboxes", `{"timeout":18446744074}`, 400, "timeout"},
		{"huge timeout", "POST", "/v2/sandboxes", `{"timeout":9223372036854775807}`, 400, "timeout"},
		{"unknown template", "POST", "/v2/sandboxes", `{"templateID":"nope"}`, 400, "nope"},
		{"internet access on a server without networks", "POST", "/v2/sandboxes", `{"allow_internet_access":true}`, 400, "allowInternetAccess"},
		{"allowOut on a server without networks", "POST", "/v2/sandboxes", `{"network":{"allowOut":["example.com"]}}`, 400, "network"},
		{"volume mounts", "POST", "/v2/sandboxes", `{"volumeMounts":[{"name":"v","path":"/data"}]}`, 400, "volumeMounts"},
		{"mcp", "POST", "/v2/sandboxes", `{"mcp":{"github":{}}}`, 400, "mcp"},
		{"a field of no E2B version", "POST", "/v2/sandboxes", `{"someFutureField":{"x":1}}`, 400, "someFutureField"},
		{"network rules", "POST", "/v2/sandboxes", `{"network":{"rules":{"api.example.com":[{"transform":{"headers":{"A":"b"}}}]}}}`, 400, "network.rules"},
		{"network egressProxy", "POST", "/v2/sandboxes", `{"network":{"egressProxy":{"address":"p:1080"}}}`, 400, "network.egressProxy"},
		{"network not an object", "POST", "/v2/sandboxes", `{"network":[1]}`, 400, "network"},
		{"an IPv6 allowOut", "POST", "/v2/sandboxes", `{"network":{"allowOut":["::/0"]}}`, 400, "IPv6"},
		{"a bad denyOut", "POST", "/v2/sandboxes", `{"allow_internet_access":true,"network":{"denyOut":["exa mple.com"]}}`, 400, "denyOut"},
		{"httpsPorts out of range", "POST", "/v2/sandboxes", `{"network":{"httpsPorts":[70000]}}`, 400, "httpsPorts"},
		{"httpsPorts of the agent", "POST", "/v2/sandboxes", `{"network":{"httpsPorts":[49983]}}`, 400, "httpsPorts"},
		{"network update of a sandbox without one", "PUT", "/sandboxes/" + id + "/network", `{"allow_internet_access":true}`, 409, "without a network"},
		{"network update with rules", "PUT", "/sandboxes/" + id + "/network", `{"rules":{"a.com":[{}]}}`, 400, "rules"},
		{"network update of no sandbox", "PUT", "/sandboxes/nope/network", `{}`, 404, "not found"},
		{"autoPauseMemory false with autoResume", "POST", "/v2/sandboxes", `{"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400, "autoResume"},
		{"env var with =", "POST", "/v2/sandboxes", `{"envVars":{"A=B":"1"}}`, 400, "A=B"},
		{"empty env var name", "POST", "/v2/sandboxes", `{"envVars":{"":"1"}}`, 400, "environment variable"},
		{"env var value with NUL", "POST", "/v2/sandboxes", `{"envVars":{"A":"\u0000"}}`, 400, `"A"`},
		{"backend not allowed", "POST", "/v2/sandboxes", `{"backend":"fake"}`, 400, "backend"},
		{"list limit 0", "GET", "/v2/sandboxes?limit=0", nil, 400, "limit"},
		{"list limit not a number", "GET", "/v2/sandboxes?limit=ten", nil, 400, "limit"},
		{"list metadata filter", "GET", "/v2/sandboxes?metadata=%25zz", nil, 400, "metadata"},
		{"list nextToken", "GET", "/v2/sandboxes?nextToken=garbage", nil, 400, "nextToken"},
		{"set timeout without one", "POST", "/sandboxes/" + id + "/timeout", `{}`, 400, "timeout"},
		{"set timeout of no body", "POST", "/sandboxes/" + id + "/timeout", nil, 400, "timeout"},
		{"set timeout negative", "POST", "/sandboxes/" + id + "/timeout", `{"timeout":-1}`, 400, "timeout"},
		{"set timeout past a Duration", "POST", "/sandboxes/" + id + "/timeout", `{"timeout":18446744074}`, 400, "timeout"},
		{"connect timeout past a Duration", "POST", "/sandboxes/" + id + "/connect", `{"timeout":18446744074}`, 400, "timeout"},
		{"pause without memory on a server without a state directory", "POST", "/sandboxes/" + id + "/pause", `{"memory":false}`, 400, "state directory"},
		{"connect bad JSON", "POST", "/sandboxes/" + id + "/connect", `{`, 400, "JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, data := a.call(tc.method, tc.path, tc.body)
			if code != tc.want {
				t.Fatalf("got %d %s, want %d", code, data, tc.want)
			}
			if msg := apiError(t, code, data); !strings.Contains(msg, tc.mention) {
				t.Errorf("message %q does not mention %q", msg, tc.mention)
			}
		})
	}
	// The SDKs add fields from one version to the next, sent empty when
	// unused: those ask for nothing, and pass.
	if code, data := a.call("POST", "/v2/sandboxes", `{"templateID":"base","secure":true,"mcp":null,"volumeMounts":[],"someFutureField":null,"network":{"rules":{}}}`); code != http.StatusCreated {
		t.Errorf("create with empty unknown fields: %d %s, want 201", code, data)
	}
	if in := a.info(id); in.State != "running" {
		t.Errorf("sandbox %s after refused requests: %+v", id, in)
	}
}

func TestTooMany(t *testing.T) {
	a := newAPI(t, sandbox.Config{MaxSandboxes: 1})
	a.create(nil)
	code, hdr, data := a.do("POST", "/v2/sandboxes", nil, http.Header{"X-Api-Key": {key}})
	if code != http.StatusTooManyRequests {
		t.Fatalf("create past the limit: %d %s, want 429", code, data)
	}
	apiError(t, code, data)
	if hdr.Get("Retry-After") == "" {
		t.Error("a 429 without Retry-After")
	}
}

// The pools, for the console: behind the key, one row per template.
func TestPools(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	code, _, _ := a.do("GET", "/airlock/pools", nil, nil)
	if code != http.StatusUnauthorized {
		t.Errorf("pools without the key: %d", code)
	}
	code, data := a.call("GET", "/airlock/pools", nil)
	var body struct {
		Pools []sandbox.PoolStatus `json:"pools"`
	}
	if code != http.StatusOK || json.Unmarshal(data, &body) != nil || len(body.Pools) != 1 || body.Pools[0].Template != "base" {
		t.Errorf("pools: %d %s", code, data)
	}
	// A size set at run time, and back to the configuration.
	sizeOf := func() int {
		_, data := a.call("GET", "/airlock/pools", nil)
		json.Unmarshal(data, &body)
		return body.Pools[0].Size
	}
	configured := sizeOf()
	if code, data := a.call("PUT", "/airlock/pools/base", map[string]any{"size": configured + 2}); code != http.StatusNoContent {
		t.Fatalf("set pool size: %d %s", code, data)
	}
	if got := sizeOf(); got != configured+2 {
		t.Errorf("size %d after PUT, want %d", got, configured+2)
	}
	for _, bad := range []any{map[string]any{"size": -1}, map[string]any{"size": 257}, map[string]any{}, map[string]any{"size": 1, "nodes": 2}, "x"} {
		if code, data := a.call("PUT", "/airlock/pools/base", bad); code != http.StatusBadRequest {
			t.Errorf("PUT %v: %d %s, want 400", bad, code, data)
		}
	}
	if code, _ := a.call("DELETE", "/airlock/pools/base", nil); code != http.StatusNoContent {
		t.Errorf("DELETE: %d", code)
	}
	if got := sizeOf(); got != configured {
		t.Errorf("size %d after DELETE, want the configured %d", got, configured)
	}
}

// A host out of room (tasks or memory) gets a 503 with a retry hint, and
// the reason stays in the log.
func TestHostFull(t *testing.T) {
	full := errors.New("12 tasks of the 10 the kernel allows")
	a := newAPI(t, sandbox.Config{HostRoom: func() error { return &sandbox.PublicError{Err: sandbox.ErrHostFull, Cause: full} }})
	code, hdr, data := a.do("POST", "/v2/sandboxes", nil, http.Header{"X-Api-Key": {key}})
	if code != http.StatusServiceUnavailable {
		t.Fatalf("create on a full host: %d %s, want 503", code, data)
	}
	apiError(t, code, data)
	if hdr.Get("Retry-After") == "" {
		t.Error("a 503 without Retry-After")
	}
	if strings.Contains(string(data), "tasks") {
		t.Errorf("the host's figures reached the client: %s", data)
	}
}

func TestGatewayTokens(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	other := a.create(nil)
	traffic := *c.TrafficAccessToken
	for _, tc := range []struct {
		name string
		port string
		hdr  http.Header
		want int
	}{
		{"envd without a token", agentproto.EnvdPort, nil, 401},
		{"envd with a wrong token", agentproto.EnvdPort, http.Header{"X-Access-Token": {"nope"}}, 401},
		{"envd with another sandbox's token", agentproto.EnvdPort, envd(other), 401},
		{"envd with the API key", agentproto.EnvdPort, http.Header{"X-Api-Key": {key}}, 401},
		{"envd with the traffic token", agentproto.EnvdPort, http.Header{"E2b-Traffic-Access-Token": {traffic}}, 401},
		{"envd with the access token", agentproto.EnvdPort, envd(c), 204},
		{"interpreter without a token", agentproto.InterpreterPort, nil, 401},
		{"interpreter with another's traffic token", agentproto.InterpreterPort, http.Header{"E2b-Traffic-Access-Token": {*other.TrafficAccessToken}}, 401},
		{"interpreter with the traffic token", agentproto.InterpreterPort, http.Header{"E2b-Traffic-Access-Token": {traffic}}, 200},
		{"interpreter with the access token", agentproto.InterpreterPort, envd(c), 200},
		{"a port nobody serves", "8080", envd(c), 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, data := a.gateway(c.SandboxID, tc.port, "GET", "/health", tc.hdr, nil)
			if code != tc.want {
				t.Fatalf("got %d %s, want %d", code, data, tc.want)
			}
			if code >= 400 {
				apiError(t, code, data)
			}
		})
	}

	// The agent's private endpoints stay private, however the path is put.
	for _, path := range []string{"/airlock/setup", "//airlock/setup", "/./airlock/setup", "/airlock/../airlock/setup", "/airlock%2Fsetup"} {
		code, data := a.gateway(c.SandboxID, agentproto.EnvdPort, "POST", path, envd(c), strings.NewReader(`{"envVars":{"LEAK":"1"}}`))
		if code == http.StatusNoContent {
			t.Errorf("POST %s through the gateway reached the agent's setup: %d %s", path, code, data)
		}
	}
	if out := a.run(c, `printf %s "$LEAK"`); out != "" {
		t.Errorf("a client set the sandbox's environment through the gateway: LEAK=%q", out)
	}

	if code, data := a.call("DELETE", "/sandboxes/"+c.SandboxID, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", code, data)
	}
	code, data := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", envd(c), nil)
	if code != http.StatusBadGateway {
		t.Errorf("a killed sandbox: %d %s, want 502", code, data)
	}
	apiError(t, code, data)
	// Without the gone sandbox's own token, it is indistinguishable from
	// a live one shown a wrong token, and so is an id never issued.
	wrong := "0" + c.EnvdAccessToken[1:] // one digit off
	if wrong == c.EnvdAccessToken {
		wrong = "1" + c.EnvdAccessToken[1:]
	}
	for _, probe := range []struct{ id, token string }{{c.SandboxID, wrong}, {"inope", c.EnvdAccessToken}, {c.SandboxID, ""}} {
		hdr := http.Header{"X-Access-Token": {probe.token}}
		if code, _ := a.gateway(probe.id, agentproto.EnvdPort, "GET", "/health", hdr, nil); code != http.StatusUnauthorized {
			t.Errorf("sandbox %s with token %q: %d, want 401", probe.id, probe.token, code)
		}
	}
	if code, _ := a.gateway(c.SandboxID, agentproto.InterpreterPort, "GET", "/health", http.Header{"E2B-Traffic-Access-Token": {*c.TrafficAccessToken}}, nil); code != http.StatusBadGateway {
		t.Errorf("a killed sandbox's interpreter port with its traffic token: %d, want 502", code)
	}
}

// frame is msg as one Connect envelope (agentproto's codec).
func frame(msg any) []byte {
	data, _ := json.Marshal(msg)
	var b bytes.Buffer
	agentproto.WriteEnvelope(&b, 0, data)
	return b.Bytes()
}

// readFrames reads envelopes up to the end of the stream and returns the
// messages and the end envelope's body.
func readFrames(r io.Reader) (msgs [][]byte, end []byte, err error) {
	for {
		flags, data, err := agentproto.ReadEnvelope(r, agentproto.MaxResponse)
		if err != nil {
			return msgs, nil, fmt.Errorf("stream ended without its end frame: %w", err)
		}
		if flags&agentproto.FlagEndStream != 0 {
			return msgs, data, nil
		}
		msgs = append(msgs, data)
	}
}

// run runs script with sh in sandbox c through the gateway and returns
// its stdout.
func (a *api) run(c created, script string) string {
	a.t.Helper()
	req, _ := http.NewRequestWithContext(a.t.Context(), "POST", a.url+"/process.Process/Start",
		bytes.NewReader(frame(map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", script}}})))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("E2b-Sandbox-Id", c.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", agentproto.EnvdPort)
	req.Header.Set("X-Access-Token", c.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	msgs, end, err := readFrames(resp.Body)
	if err != nil {
		a.t.Fatalf("run %q: %d: %v", script, resp.StatusCode, err)
	}
	if string(end) != "{}" {
		a.t.Fatalf("run %q: stream error %s", script, end)
	}
	var stdout []byte
	for _, m := range msgs {
		var ev struct {
			Event struct {
				Data *struct {
					Stdout string `json:"stdout"`
				} `json:"data"`
			} `json:"event"`
		}
		if err := json.Unmarshal(m, &ev); err != nil {
			a.t.Fatalf("run %q: message %s: %v", script, m, err)
		}
		if ev.Event.Data != nil {
			b, err := base64.StdEncoding.DecodeString(ev.Event.Data.Stdout)
			if err != nil {
				a.t.Fatal(err)
			}
			stdout = append(stdout, b...)
		}
	}
	return string(stdout)
}

func TestGatewayRunsCommandsWithTheSandboxEnv(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(map[string]any{"envVars": map[string]string{"GREETING": "hello there"}})
	if out := a.run(c, `printf %s "$GREETING"`); out != "hello there" {
		t.Errorf("stdout %q, want the sandbox's envVars", out)
	}
	if n := a.m.Metrics().Execs.Load(); n != 1 {
		t.Errorf("execs = %d, want 1", n)
	}
}

func TestPauseConnectResume(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(map[string]any{"timeout": 60})
	id := c.SandboxID
	if code, data := a.call("POST", "/sandboxes/"+id+"/pause", nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, data)
	}
	if in := a.info(id); in.State != "paused" {
		t.Errorf("state %q after pause, want paused", in.State)
	}
	code, data := a.call("POST", "/sandboxes/"+id+"/pause", nil)
	if code != http.StatusConflict {
		t.Errorf("second pause: %d %s, want 409", code, data)
	}
	if code, data := a.call("POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 60}); code != http.StatusConflict {
		t.Errorf("timeout of a paused sandbox: %d %s, want 409", code, data)
	}
	// Not set to resume by traffic: the gateway says so at once instead of
	// waiting on an agent that cannot answer.
	if code, data := a.gateway(id, agentproto.EnvdPort, "GET", "/health", envd(c), nil); code != http.StatusBadGateway {
		t.Errorf("gateway to a paused sandbox: %d %s, want 502", code, data)
	}

	code, data = a.call("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 300})
	var again created
	if code != http.StatusOK || json.Unmarshal(data, &again) != nil {
		t.Fatalf("connect: %d %s", code, data)
	}
	if again.SandboxID != id || again.EnvdAccessToken != c.EnvdAccessToken {
		t.Errorf("connect answered %s, want the same sandbox and token", data)
	}
	in := a.info(id)
	if in.State != "running" || time.Until(in.EndAt) < 4*time.Minute {
		t.Errorf("after connect: state %q, endAt %v; want running with the 300 s asked for", in.State, in.EndAt)
	}
	if code, data := a.gateway(id, agentproto.EnvdPort, "GET", "/health", envd(c), nil); code != http.StatusNoContent {
		t.Errorf("gateway after connect: %d %s, want 204", code, data)
	}

	// Connect to a running sandbox extends its time, never shortens it.
	end := a.info(id).EndAt
	if code, data := a.call("POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 10}); code != http.StatusOK {
		t.Fatalf("connect: %d %s", code, data)
	}
	if got := a.info(id).EndAt; got.Before(end) {
		t.Errorf("connect with a shorter timeout moved endAt from %v to %v", end, got)
	}

	// The legacy resume route does what connect does.
	a.call("POST", "/sandboxes/"+id+"/pause", nil)
	if code, data := a.call("POST", "/sandboxes/"+id+"/resume", nil); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, data)
	}
	if in := a.info(id); in.State != "running" {
		t.Errorf("state %q after resume", in.State)
	}
	if code, _ := a.call("POST", "/sandboxes/inope/connect", nil); code != http.StatusNotFound {
		t.Errorf("connect to an unknown sandbox: %d, want 404", code)
	}
}

func TestGatewayAutoResume(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(map[string]any{"autoResume": map[string]any{"enabled": true}})
	if code, data := a.call("POST", "/sandboxes/"+c.SandboxID+"/pause", nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, data)
	}
	if code, data := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", envd(c), nil); code != http.StatusNoContent {
		t.Fatalf("gateway to an auto-resuming sandbox: %d %s, want 204", code, data)
	}
	if in := a.info(c.SandboxID); in.State != "running" {
		t.Errorf("state %q after traffic, want running", in.State)
	}
	// A request without the token resumes nothing.
	a.call("POST", "/sandboxes/"+c.SandboxID+"/pause", nil)
	if code, _ := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("gateway without a token: %d, want 401", code)
	}
	if in := a.info(c.SandboxID); in.State != "paused" {
		t.Errorf("state %q after an unauthorized request, want paused", in.State)
	}
}

func TestShuttingDown(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	a.m.Shutdown()
	code, data := a.call("POST", "/v2/sandboxes", nil)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("create after shutdown: %d %s, want 503", code, data)
	}
	apiError(t, code, data)
	if code, _ := a.call("GET", "/sandboxes/"+c.SandboxID, nil); code != http.StatusNotFound {
		t.Errorf("get of a sandbox killed at shutdown: %d, want 404", code)
	}
	if code, _ := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", envd(c), nil); code != http.StatusBadGateway {
		t.Errorf("gateway after shutdown: %d, want 502", code)
	}
}

func TestInternalErrorsHideDetails(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	a.b.SetStartError(errors.New("mkdir /var/lib/airlock/secret: permission denied"))
	code, data := a.call("POST", "/v2/sandboxes", nil)
	if code != http.StatusInternalServerError {
		t.Fatalf("create with a failing backend: %d %s, want 500", code, data)
	}
	if msg := apiError(t, code, data); strings.Contains(msg, "/var/lib") {
		t.Errorf("the message shows a host path: %q", msg)
	}
}

// A refusal is the client's doing and keeps its status, but a message
// that names a host directory of the server is not sent, whatever built
// it (the last guard), and a PublicError's cause is never sent.
func TestRefusalsHideHostPaths(t *testing.T) {
	state := t.TempDir()
	a := newAPI(t, sandbox.Config{StateDir: state})
	a.b.SetStartError(fmt.Errorf("%w: %s/runsc is missing", backend.ErrUnsupported, state))
	code, data := a.call("POST", "/v2/sandboxes", nil)
	if code != http.StatusBadRequest {
		t.Fatalf("create refused by the backend: %d %s, want 400", code, data)
	}
	if msg := apiError(t, code, data); strings.Contains(msg, state) {
		t.Errorf("the message shows the state directory: %q", msg)
	}

	s := &Server{log: slog.New(slog.DiscardHandler)}
	err := &sandbox.PublicError{Err: fmt.Errorf("%w: snapshot s cannot run here", sandbox.ErrInvalid), Cause: errors.New("runsc not found in /opt/secret")}
	if code, msg := s.errorOf(fmt.Errorf("create: %w", err)); code != http.StatusBadRequest || strings.Contains(msg, "/opt/secret") || !strings.Contains(msg, "cannot run here") {
		t.Errorf("a PublicError: %d %q, want 400 with its public words only", code, msg)
	}
}
