package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRouterMergesLists: a list asks every live node and merges their
// pages in the nodes' own order (start time, then id), cut at the limit,
// with the token of the last; a refusal of one node is the answer.
func TestRouterMergesLists(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	item := func(node string, minute int) string {
		return fmt.Sprintf(`{"sandboxID":"%s","startedAt":"%s","domain":"node.internal"}`,
			sandboxID(node)[:19]+strconv.Itoa(minute), t0.Add(time.Duration(minute)*time.Minute).Format(time.RFC3339))
	}
	page := func(node string, minutes ...int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("state") == "bogus" {
				writeError(w, http.StatusBadRequest, "state %q is not running or paused", "bogus")
				return
			}
			var items []string
			for _, m := range minutes {
				items = append(items, item(node, m))
			}
			if r.URL.Query().Get("limit") == "2" && len(items) > 2 {
				items = items[:2]
				w.Header().Set("X-Next-Token", "more")
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "["+strings.Join(items, ",")+"]")
		}
	}
	a, b := newFakeNode(t, "a", page("a", 9, 5, 1)), newFakeNode(t, "b", page("b", 7, 3))
	now := time.Now()
	rt := newTestRouter(t, fakeClient(append(registered("a", a.srv.URL, 0, nil, now), registered("b", b.srv.URL, 0, nil, now)...)...))
	list := func(query string) ([]string, string, string) {
		t.Helper()
		code, hdr, body := rt.do(t, "GET", "/v2/sandboxes"+query, routerKey, "", nil)
		if code != http.StatusOK {
			t.Fatalf("list%s: %d %s", query, code, body)
		}
		var items []struct {
			SandboxID string    `json:"sandboxID"`
			StartedAt time.Time `json:"startedAt"`
			Domain    string    `json:"domain"`
		}
		if err := json.Unmarshal([]byte(body), &items); err != nil {
			t.Fatal(err)
		}
		var order []string
		for _, it := range items {
			if it.Domain != "router.test:8080" {
				t.Errorf("an item's domain: %q", it.Domain)
			}
			order = append(order, it.SandboxID[len(it.SandboxID)-1:]+"@"+strconv.Itoa(int(it.StartedAt.Sub(t0)/time.Minute)))
		}
		return order, hdr.Get("X-Next-Token"), body
	}
	if got, next, _ := list(""); strings.Join(got, " ") != "9@9 7@7 5@5 3@3 1@1" || next != "" {
		t.Errorf("newest first: %v, next %q", got, next)
	}
	if got, _, _ := list("?order=asc"); strings.Join(got, " ") != "1@1 3@3 5@5 7@7 9@9" {
		t.Errorf("oldest first: %v", got)
	}
	got, next, _ := list("?limit=2")
	want := strconv.FormatInt(t0.Add(7*time.Minute).UnixNano(), 10) + "." + sandboxID("b")[:19] + "7"
	if strings.Join(got, " ") != "9@9 7@7" || next != want {
		t.Errorf("a page of 2: %v, next %q, want %q", got, next, want)
	}
	if code, _, body := rt.do(t, "GET", "/sandboxes?state=bogus", routerKey, "", nil); code != http.StatusBadRequest || !strings.Contains(body, `state \"bogus\" is not running or paused`) {
		t.Errorf("a list the nodes refuse: %d %s", code, body)
	}
	for _, n := range []*fakeNode{a, b} {
		if r := n.requests()[0]; r.uri != "/v2/sandboxes" || r.header.Get("X-Api-Key") != routerKey {
			t.Errorf("node %s was asked %s with key %q", n.name, r.uri, r.header.Get("X-Api-Key"))
		}
	}
}

// TestRouterMergesPoolsAndSnapshots: pools name their node and their
// memory budgets add up; snapshots are every node's.
func TestRouterMergesPoolsAndSnapshots(t *testing.T) {
	answer := func(pools, snapshots string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.URL.Path == "/snapshots" {
				io.WriteString(w, snapshots)
				return
			}
			io.WriteString(w, pools)
		}
	}
	a := newFakeNode(t, "a", answer(`{"pools":[{"template":"base","size":2,"ready":1}],"memoryBudgetBytes":100}`, `[{"snapshotID":"s1"}]`))
	b := newFakeNode(t, "b", answer(`{"pools":[{"template":"base","size":1,"ready":0}],"memoryBudgetBytes":50}`, `[{"snapshotID":"s2"},{"snapshotID":"s3"}]`))
	now := time.Now()
	rt := newTestRouter(t, fakeClient(append(registered("a", a.srv.URL, 0, nil, now), registered("b", b.srv.URL, 0, nil, now)...)...))
	_, _, body := rt.do(t, "GET", "/airlock/pools", routerKey, "", nil)
	var pools struct {
		Pools []struct {
			Node     string `json:"node"`
			Template string `json:"template"`
			Size     int    `json:"size"`
		} `json:"pools"`
		Budget int64 `json:"memoryBudgetBytes"`
	}
	if err := json.Unmarshal([]byte(body), &pools); err != nil || pools.Budget != 150 || len(pools.Pools) != 2 {
		t.Fatalf("pools: %s (%v)", body, err)
	}
	sizes := map[string]int{}
	for _, p := range pools.Pools {
		sizes[p.Node+"/"+p.Template] = p.Size
	}
	if sizes["a/base"] != 2 || sizes["b/base"] != 1 {
		t.Errorf("pools by node: %v", sizes)
	}
	_, _, body = rt.do(t, "GET", "/snapshots", routerKey, "", nil)
	var snaps []struct {
		ID string `json:"snapshotID"`
	}
	json.Unmarshal([]byte(body), &snaps)
	var ids []string
	for _, s := range snaps {
		ids = append(ids, s.ID)
	}
	if slices.Sort(ids); strings.Join(ids, ",") != "s1,s2,s3" {
		t.Errorf("snapshots: %s", body)
	}
}

// TestRouterMergesMetrics: several sandboxes' metrics are asked of every
// node, each answering for its own, and merged; a refusal is relayed.
func TestRouterMergesMetrics(t *testing.T) {
	answer := func(id string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/sandboxes/metrics" || r.URL.Query().Get("sandbox_ids") == "" {
				writeError(w, http.StatusBadRequest, "sandbox_ids is required")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"sandboxes":{%q:{"memUsed":1}}}`, id)
		}
	}
	a, b := newFakeNode(t, "a", answer("ia")), newFakeNode(t, "b", answer("ib"))
	now := time.Now()
	rt := newTestRouter(t, fakeClient(append(registered("a", a.srv.URL, 0, nil, now), registered("b", b.srv.URL, 0, nil, now)...)...))
	code, _, body := rt.do(t, "GET", "/sandboxes/metrics?sandbox_ids=ia,ib", routerKey, "", nil)
	var got struct {
		Sandboxes map[string]struct {
			MemUsed int `json:"memUsed"`
		} `json:"sandboxes"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || len(got.Sandboxes) != 2 || got.Sandboxes["ia"].MemUsed != 1 || got.Sandboxes["ib"].MemUsed != 1 {
		t.Errorf("metrics: %d %s", code, body)
	}
	if code, _, body := rt.do(t, "GET", "/sandboxes/metrics", routerKey, "", nil); code != http.StatusBadRequest {
		t.Errorf("metrics without ids: %d %s", code, body)
	}
}

// TestRouterSignedFiles: a signed file URL names no sandbox: it is asked
// of each node in turn until one's sandbox made the signature; an upload
// is sent again, whole, to each. What cannot be a signature is refused
// without asking any node.
func TestRouterSignedFiles(t *testing.T) {
	notMine := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusUnauthorized, "invalid signature")
	}
	mine := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		io.WriteString(w, "the file")
	}
	a, b := newFakeNode(t, "a", notMine), newFakeNode(t, "b", mine)
	now := time.Now()
	rt := newTestRouter(t, fakeClient(append(registered("a", a.srv.URL, 0, nil, now), registered("b", b.srv.URL, 0, nil, now)...)...))
	future := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	path := "/files?path=%2Fhome%2Fuser%2Fx&signature=v1_abc&signature_expiration=" + future
	if code, _, body := rt.do(t, "GET", path, "", "", nil); code != http.StatusOK || body != "the file" {
		t.Errorf("a signed download: %d %q", code, body)
	}
	if code, _, body := rt.do(t, "POST", path, "", "uploaded bytes", http.Header{"Content-Type": {"application/octet-stream"}}); code != http.StatusOK || body != "the file" {
		t.Errorf("a signed upload: %d %q", code, body)
	}
	for _, n := range []*fakeNode{a, b} {
		reqs := n.requests()
		if len(reqs) != 2 || reqs[1].method != "POST" || reqs[1].body != "uploaded bytes" || reqs[1].uri != path {
			t.Errorf("node %s saw %+v, want the download and the whole upload", n.name, reqs)
		}
	}
	past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
	// Refused as envd refuses them, in its words.
	for bad, want := range map[string]string{
		"/files?path=x&signature=v2_abc":                              `401 {"code":401,"message":"invalid signature"}`,
		"/files?path=x&signature=v1_abc&signature_expiration=" + past: `401 {"code":401,"message":"signature is already expired"}`,
		"/files?path=x&signature=v1_abc&signature_expiration=soon":    `400 {"code":400,"message":"Invalid format for parameter signature_expiration: want a Unix time in seconds"}`,
	} {
		if code, _, body := rt.do(t, "GET", bad, "", "", nil); fmt.Sprint(code, " ", strings.TrimSpace(body)) != want {
			t.Errorf("%s: %d %s, want %s", bad, code, body, want)
		}
	}
	if code, _, _ := rt.do(t, "PUT", path, "", "", nil); code != http.StatusUnauthorized {
		t.Errorf("a signed PUT: %d", code)
	}
	if len(a.requests()) != 2 || len(b.requests()) != 2 {
		t.Errorf("refused signatures reached the nodes")
	}
	// No node's sandbox signed it.
	b.mu.Lock()
	b.handle = notMine
	b.mu.Unlock()
	if code, _, _ := rt.do(t, "GET", path, "", "", nil); code != http.StatusUnauthorized {
		t.Errorf("a signature no node made: %d", code)
	}
}
