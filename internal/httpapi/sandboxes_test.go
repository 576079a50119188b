package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

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
	// The backend counts 20 MiB in use, 3 of them page cache.
	insts := a.b.Instances()
	insts[len(insts)-1].SetUsage(backend.Usage{Memory: 20 << 20, Cache: 3 << 20})
	code, data := a.call("GET", "/sandboxes/"+c.SandboxID+"/metrics", nil)
	var ms []struct {
		CPUCount   *int64   `json:"cpuCount"`
		CPUUsedPct *float64 `json:"cpuUsedPct"`
		MemUsed    *int64   `json:"memUsed"`
		MemTotal   *int64   `json:"memTotal"`
		MemCache   *int64   `json:"memCache"`
		DiskTotal  *int64   `json:"diskTotal"`
		Timestamp  int64    `json:"timestampUnix"`
	}
	if code != http.StatusOK || json.Unmarshal(data, &ms) != nil || len(ms) != 1 {
		t.Fatalf("metrics: %d %s", code, data)
	}
	// diskTotal is what its file systems hold: the default 1 GiB disk
	// bounded by the 512 MiB of memory (policy.WritableBytes). Every
	// field is there (E2B's Python SDK raises KeyError for any missing).
	m := ms[0]
	if m.CPUCount == nil || m.CPUUsedPct == nil || m.MemUsed == nil || m.MemTotal == nil || m.MemCache == nil || m.DiskTotal == nil {
		t.Fatalf("metrics %s: a field is missing", data)
	}
	if *m.MemUsed != 20<<20 || *m.MemCache != 3<<20 || *m.MemTotal != 512<<20 || *m.CPUCount != 1 || *m.DiskTotal != 384<<20 || m.Timestamp == 0 {
		t.Errorf("metrics %s", data)
	}
	_, body := a.call("GET", "/metrics", nil)
	for _, want := range []string{`airlock_sandboxes_running{template="base"} 1`, `airlock_sandbox_creates_total{source="cold"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestMetricsList: GET /sandboxes/metrics answers the latest metric of
// each running sandbox it names, once, and leaves out the paused and the
// unknown, as E2B lists running sandboxes only.
func TestMetricsList(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	x, y := a.create(nil), a.create(nil)
	insts := a.b.Instances()
	insts[len(insts)-2].SetUsage(backend.Usage{Memory: 20 << 20, Cache: 3 << 20})
	if code, data := a.call("POST", "/sandboxes/"+y.SandboxID+"/pause", nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, data)
	}
	code, data := a.call("GET", "/sandboxes/metrics?sandbox_ids="+x.SandboxID+","+y.SandboxID+",nope,"+x.SandboxID, nil)
	var list struct {
		Sandboxes map[string]struct {
			MemUsed  int64 `json:"memUsed"`
			MemCache int64 `json:"memCache"`
		} `json:"sandboxes"`
	}
	if code != http.StatusOK || json.Unmarshal(data, &list) != nil {
		t.Fatalf("metrics list: %d %s", code, data)
	}
	if m, ok := list.Sandboxes[x.SandboxID]; len(list.Sandboxes) != 1 || !ok || m.MemUsed != 20<<20 || m.MemCache != 3<<20 {
		t.Errorf("metrics list %s, want only %s's, with its usage", data, x.SandboxID)
	}
	many := strings.Repeat("a,", maxMetricsIDs) + "a"
	for _, q := range []string{"", "?sandbox_ids=", "?sandbox_ids=" + many} {
		if code, data := a.call("GET", "/sandboxes/metrics"+q, nil); code != http.StatusBadRequest {
			t.Errorf("metrics list%s: %d %s, want 400", q, code, data)
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

	// 201: resumed, as E2B answers.
	code, data = a.call("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 300})
	var again created
	if code != http.StatusCreated || json.Unmarshal(data, &again) != nil {
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

	// The legacy resume route resumes a paused sandbox (201), and refuses
	// a running one (409), as E2B's.
	a.call("POST", "/sandboxes/"+id+"/pause", nil)
	if code, data := a.call("POST", "/sandboxes/"+id+"/resume", nil); code != http.StatusCreated {
		t.Fatalf("resume: %d %s", code, data)
	}
	if in := a.info(id); in.State != "running" {
		t.Errorf("state %q after resume", in.State)
	}
	if code, data := a.call("POST", "/sandboxes/"+id+"/resume", nil); code != http.StatusConflict {
		t.Errorf("resume of a running sandbox: %d %s, want 409", code, data)
	}
	if code, _ := a.call("POST", "/sandboxes/inope/connect", nil); code != http.StatusNotFound {
		t.Errorf("connect to an unknown sandbox: %d, want 404", code)
	}
}
