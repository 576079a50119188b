package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/secret"
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

func TestBadInput(t *testing.T) {
	a := newAPI(t, sandbox.Config{MaxTTL: time.Hour})
	secrets, err := secret.Open(filepath.Join(t.TempDir(), "secrets"))
	if err != nil {
		t.Fatal(err)
	}
	a.s.HandleSecrets(secrets)
	if _, err := secrets.Create("taken", "v", nil); err != nil {
		t.Fatal(err)
	}
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
		{"volume mounts on a server without volumes", "POST", "/v2/sandboxes", `{"volumeMounts":[{"name":"v","path":"/data"}]}`, 400, "no volumes"},
		{"volume mount path", "POST", "/v2/sandboxes", `{"volumeMounts":[{"name":"v","path":"data/../x"}]}`, 400, "volume mount #0: path must be absolute"},
		{"volume mount twice", "POST", "/v2/sandboxes", `{"volumeMounts":[{"name":"v","path":"/a"},{"name":"v","path":"/a"}]}`, 400, "path '/a' is already used"},
		{"mcp", "POST", "/v2/sandboxes", `{"mcp":{"github":{}}}`, 400, "mcp"},
		{"a field of no E2B version", "POST", "/v2/sandboxes", `{"someFutureField":{"x":1}}`, 400, "someFutureField"},
		{"network rules without a network", "POST", "/v2/sandboxes", `{"network":{"rules":{"api.example.com":[{"transform":{"headers":{"A":"b"}}}]}}}`, 400, "network.rules need a network"},
		{"a network rule's unknown field", "POST", "/v2/sandboxes", `{"network":{"rules":{"a.com":[{"transform":{"headers":{}},"body":"x"}]}}}`, 400, `unknown field "body"`},
		{"a network rule's unknown secret", "POST", "/v2/sandboxes", `{"network":{"rules":{"a.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.nope}"}}}]}}}`, 400, `no secret named "nope"`},
		{"a network rule's identity token", "POST", "/v2/sandboxes", `{"network":{"rules":{"a.com":[{"transform":{"headers":{"Authorization":"${e2b.identity.tokens.aws}"}}}]}}}`, 400, "iam"},
		{"a network rule's bare wildcard", "POST", "/v2/sandboxes", `{"network":{"rules":{"*":[{}]}}}`, 400, "rules: host"},
		{"a network rule over a public suffix", "POST", "/v2/sandboxes", `{"network":{"rules":{"*.github.io":[{}]}}}`, 400, "public suffix"},
		{"a network rule over a top-level domain", "POST", "/v2/sandboxes", `{"network":{"rules":{"*.COM":[{}]}}}`, 400, "public suffix"},
		{"a network rule setting Host", "POST", "/v2/sandboxes", `{"network":{"rules":{"a.com":[{"transform":{"headers":{"Host":"b.com"}}}]}}}`, 400, "Host"},
		{"iam", "POST", "/v2/sandboxes", `{"iam":{"tokens":{"aws":{"audience":"x","tokenType":"JWT-SVID"}}}}`, 400, "iam"},
		{"secret without a value", "POST", "/secrets", `{"name":"a"}`, 400, "value"},
		{"secret of a reserved name", "POST", "/secrets", `{"name":"sec_x","value":"v"}`, 400, "sec_"},
		{"secret with a line break", "POST", "/secrets", `{"name":"b","value":"v\r\nX: y"}`, 400, "control character"},
		{"secret's unknown field", "POST", "/secrets", `{"name":"b","value":"v","ttl":5}`, 400, "ttl"},
		{"secret of that name", "POST", "/secrets", `{"name":"Taken","value":"v"}`, 409, "taken"},
		{"secret update of none", "POST", "/secrets/nope", `{"value":"v"}`, 404, "not found"},
		{"secret list limit", "GET", "/secrets?limit=0", nil, 400, "limit"},
		{"secret list token", "GET", "/secrets?nextToken=garbage", nil, 400, "token"},
		// Addresses only: a name would be looked up on the host's network.
		{"egressProxy on a private address", "POST", "/v2/sandboxes", `{"network":{"egressProxy":{"address":"10.0.0.1:1080"}}}`, 400, "private or reserved"},
		{"egressProxy on metadata", "POST", "/v2/sandboxes", `{"network":{"egressProxy":{"address":"169.254.169.254:1080"}}}`, 400, "private or reserved"},
		{"egressProxy without a port", "POST", "/v2/sandboxes", `{"network":{"egressProxy":{"address":"203.0.113.9"}}}`, 400, "host:port"},
		{"egressProxy password without a username", "POST", "/v2/sandboxes", `{"network":{"egressProxy":{"address":"203.0.113.9:1080","password":"x"}}}`, 400, "needs a username"},
		{"egressProxy's unknown field", "POST", "/v2/sandboxes", `{"network":{"egressProxy":{"address":"203.0.113.9:1080","kind":"http"}}}`, 400, `unknown field "kind"`},
		{"egressProxy without a network", "POST", "/v2/sandboxes", `{"network":{"egressProxy":{"address":"203.0.113.9:1080"}}}`, 400, "needs a network"},
		{"network not an object", "POST", "/v2/sandboxes", `{"network":[1]}`, 400, "network"},
		{"an IPv6 allowOut", "POST", "/v2/sandboxes", `{"network":{"allowOut":["::/0"]}}`, 400, "IPv6"},
		{"a bad denyOut", "POST", "/v2/sandboxes", `{"allow_internet_access":true,"network":{"denyOut":["exa mple.com"]}}`, 400, "denyOut"},
		{"httpsPorts out of range", "POST", "/v2/sandboxes", `{"network":{"httpsPorts":[70000]}}`, 400, "httpsPorts"},
		{"httpsPorts of the agent", "POST", "/v2/sandboxes", `{"network":{"httpsPorts":[49983]}}`, 400, "httpsPorts"},
		{"network update of a sandbox without one", "PUT", "/sandboxes/" + id + "/network", `{"allow_internet_access":true}`, 409, "no network interface"},
		{"network update with bad rules", "PUT", "/sandboxes/" + id + "/network", `{"rules":{"a b":[{}]}}`, 400, "rules"},
		{"network update with a private egressProxy", "PUT", "/sandboxes/" + id + "/network", `{"egressProxy":{"address":"192.168.1.1:1080"}}`, 400, "egressProxy"},
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
