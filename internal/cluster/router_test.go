package cluster

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// The router against client-go's fake dynamic client, which keeps
// AirlockNodes and Leases as an API server would (list, watch, create,
// delete), and node daemons that are HTTP servers on loopback.

const routerKey = "router-key"

// fakeNode is a node daemon's API: it answers with handle and writes
// down each request that reached it.
type fakeNode struct {
	name string
	srv  *httptest.Server

	mu     sync.Mutex
	seen   []seenRequest
	handle http.HandlerFunc
}

type seenRequest struct {
	method, uri string
	header      http.Header
	body        string
}

func newFakeNode(t *testing.T, name string, handle http.HandlerFunc) *fakeNode {
	t.Helper()
	n := &fakeNode{name: name, handle: handle}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n.mu.Lock()
		n.seen = append(n.seen, seenRequest{r.Method, r.URL.RequestURI(), r.Header.Clone(), string(body)})
		h := n.handle
		n.mu.Unlock()
		if h == nil {
			writeJSON(w, http.StatusOK, map[string]string{"node": name, "path": r.URL.Path, "domain": "node.internal"})
			return
		}
		h(w, r)
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *fakeNode) requests() []seenRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.seen)
}

// sandboxID is an id of a sandbox of node name.
func sandboxID(name string) string { return "i" + IDPrefix(name) + "0123456789abc" }

// registered is node's AirlockNode, with its load, and a Lease renewed
// at renewed.
func registered(name, address string, sandboxes int64, ready map[string]int64, renewed time.Time) []runtime.Object {
	u := nodeObject(name, address)
	var pools []any
	for t, n := range ready {
		pools = append(pools, map[string]any{"template": t, "ready": n, "size": n})
	}
	u.Object["status"] = map[string]any{"sandboxes": sandboxes, "pools": pools}
	return []runtime.Object{u, leaseObject(name, renewed)}
}

// testRouter is a Router on client's objects, served on loopback.
type testRouter struct {
	*Router
	url string
}

func newTestRouter(t *testing.T, client dynamic.Interface) *testRouter {
	t.Helper()
	rt, err := NewRouter(t.Context(), client, "airlock", routerKey, "router.test:8080", slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rt)
	t.Cleanup(srv.Close)
	return &testRouter{rt, srv.URL}
}

// do sends a request to the router; key "" sends none.
func (rt *testRouter) do(t *testing.T, method, path, key, body string, hdr http.Header) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, rt.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if hdr.Get("Host") != "" {
		req.Host = hdr.Get("Host")
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

func liveNames(rt *Router) []string {
	var names []string
	for _, n := range rt.nodes.live() {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return names
}

// TestRouterRoutesByID: every request of a sandbox reaches the node its
// id names, by path, by header or by host name; the API key guards the
// control plane only; the router sets the headers that say what a
// request is.
func TestRouterRoutesByID(t *testing.T) {
	a, b := newFakeNode(t, "node-a", nil), newFakeNode(t, "node-b", nil)
	now := time.Now()
	client := fakeClient(append(registered("node-a", a.srv.URL, 0, nil, now), registered("node-b", b.srv.URL, 0, nil, now)...)...)
	rt := newTestRouter(t, client)
	if got := liveNames(rt.Router); !slices.Equal(got, []string{"node-a", "node-b"}) {
		t.Fatalf("live nodes: %v", got)
	}

	// The control plane, by path; the node's domain becomes the router's.
	code, _, body := rt.do(t, "GET", "/sandboxes/"+sandboxID("node-b"), routerKey, "", nil)
	if code != http.StatusOK || !strings.Contains(body, `"node":"node-b"`) || !strings.Contains(body, `"domain":"router.test:8080"`) {
		t.Errorf("GET a sandbox of node-b: %d %s", code, body)
	}
	if code, _, _ := rt.do(t, "DELETE", "/v2/sandboxes/"+sandboxID("node-a")+"/pause", routerKey, "", nil); code != http.StatusOK || a.requests()[0].uri != "/v2/sandboxes/"+sandboxID("node-a")+"/pause" {
		t.Errorf("a v2 path: %d, node-a saw %+v", code, a.requests())
	}
	if code, _, _ := rt.do(t, "GET", "/sandboxes/"+sandboxID("node-a"), "", "", http.Header{"Authorization": {"Bearer " + routerKey}}); code != http.StatusOK {
		t.Errorf("with a bearer token: %d", code)
	}
	for _, key := range []string{"", "wrong"} {
		if code, _, body := rt.do(t, "GET", "/sandboxes/"+sandboxID("node-a"), key, "", nil); code != http.StatusUnauthorized || !strings.Contains(body, "invalid or missing API key") {
			t.Errorf("with key %q: %d %s", key, code, body)
		}
	}

	// Sandbox traffic needs no key: the node checks the sandbox's token.
	before := len(a.requests())
	code, _, _ = rt.do(t, "GET", "/files?path=x", "", "", http.Header{
		"E2b-Sandbox-Id": {sandboxID("node-a")}, "E2b-Sandbox-Port": {"49983"},
		// A client may not make the proxy drop the header, nor forge
		// where the request came from.
		"Connection": {"E2b-Sandbox-Id"}, "X-Forwarded-For": {"203.0.113.9"},
	})
	seen := a.requests()
	if code != http.StatusOK || len(seen) != before+1 {
		t.Fatalf("envd traffic: %d, node-a saw %d requests", code, len(seen)-before)
	}
	got := seen[len(seen)-1]
	if got.header.Get("E2b-Sandbox-Id") != sandboxID("node-a") || got.header.Get("E2b-Sandbox-Port") != "49983" || got.header.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("envd traffic reached node-a with %v", got.header)
	}
	// By host name, as the SDKs' getHost builds it.
	code, _, _ = rt.do(t, "GET", "/health", "", "", http.Header{"Host": {"3000-" + sandboxID("node-b") + ".Router.Test:8080"}})
	got = b.requests()[len(b.requests())-1]
	if code != http.StatusOK || got.uri != "/health" || got.header.Get("E2b-Sandbox-Id") != sandboxID("node-b") || got.header.Get("E2b-Sandbox-Port") != "3000" {
		t.Errorf("by host name: %d, node-b saw %+v", code, got)
	}

	// Ids that name no live node are not found, at once.
	for _, id := range []string{sandboxID("node-c"), "i0123", "nonsense"} {
		if code, _, body := rt.do(t, "GET", "/sandboxes/"+id, routerKey, "", nil); code != http.StatusNotFound || !strings.Contains(body, `sandbox \"`+id+`\" not found`) {
			t.Errorf("sandbox %s: %d %s", id, code, body)
		}
		if code, _, _ := rt.do(t, "GET", "/files", "", "", http.Header{"E2b-Sandbox-Id": {id}}); code != http.StatusNotFound {
			t.Errorf("traffic of sandbox %s: %d", id, code)
		}
	}

	// What the router answers itself.
	for _, tc := range []struct {
		method, path, key string
		code              int
		body              string
	}{
		{"GET", "/health", "", http.StatusOK, `{"status":"ok"}`},
		{"POST", "/v3/templates", routerKey, http.StatusBadRequest, "invalid JSON body"},
		{"GET", "/templates/a/b/c/d/e", routerKey, http.StatusNotFound, "not found"},
		{"POST", "/mcp", routerKey, http.StatusNotImplemented, "MCP sessions are not routed"},
		{"GET", "/elsewhere", routerKey, http.StatusNotFound, "not found"},
		{"GET", "/", "", http.StatusUnauthorized, "API key"}, // no console configured
	} {
		if code, _, body := rt.do(t, tc.method, tc.path, tc.key, "", nil); code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s %s: %d %s, want %d with %q", tc.method, tc.path, code, body, tc.code, tc.body)
		}
	}
	var nodes []node
	_, _, body = rt.do(t, "GET", "/airlock/nodes", routerKey, "", nil)
	if json.Unmarshal([]byte(body), &nodes); len(nodes) != 2 || nodes[0].Prefix != IDPrefix(nodes[0].Name) {
		t.Errorf("/airlock/nodes: %s", body)
	}
}

// TestRouterConsole: the console's page and assets are served without a
// key, and nothing else of the router is.
func TestRouterConsole(t *testing.T) {
	rt := newTestRouter(t, fakeClient())
	rt.Console = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "console "+r.URL.Path) })
	for path, want := range map[string]string{"/": "console /", "/assets/x.js": "console /assets/x.js"} {
		if code, _, body := rt.do(t, "GET", path, "", "", nil); code != http.StatusOK || body != want {
			t.Errorf("GET %s: %d %q", path, code, body)
		}
	}
	if code, _, _ := rt.do(t, "POST", "/", "", "", nil); code != http.StatusUnauthorized {
		t.Errorf("POST /: %d, want 401", code)
	}
}

// TestRouterPlacesCreates: a create goes to a node with a ready pooled
// sandbox of its template, else to the least loaded; a node that is
// full, shutting down or without the template hands it to the next; any
// other refusal is the answer.
func TestRouterPlacesCreates(t *testing.T) {
	answers := map[string]struct {
		code int
		body string
	}{}
	var mu sync.Mutex
	handler := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			a, ok := answers[name]
			mu.Unlock()
			if !ok {
				a.code, a.body = http.StatusCreated, `{"sandboxID":"`+sandboxID(name)+`","domain":"node.internal"}`
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(a.code)
			io.WriteString(w, a.body)
		}
	}
	warm, idle := newFakeNode(t, "warm", handler("warm")), newFakeNode(t, "idle", handler("idle"))
	now := time.Now()
	rt := newTestRouter(t, fakeClient(append(
		registered("warm", warm.srv.URL, 5, map[string]int64{"code-interpreter-v1": 100}, now),
		registered("idle", idle.srv.URL, 0, nil, now)...)...))
	create := func(template string) (int, string, string) {
		t.Helper()
		nw, ni := len(warm.requests()), len(idle.requests())
		code, hdr, body := rt.do(t, "POST", "/sandboxes", routerKey, `{"templateID":"`+template+`"}`, nil)
		var to []string
		if len(warm.requests()) > nw {
			to = append(to, "warm")
		}
		if len(idle.requests()) > ni {
			to = append(to, "idle")
		}
		if hdr.Get("Content-Length") == "" {
			t.Errorf("create: no Content-Length")
		}
		return code, strings.Join(to, ","), body
	}
	if code, to, body := create("code-interpreter-v1"); code != http.StatusCreated || to != "warm" || !strings.Contains(body, `"domain":"router.test:8080"`) {
		t.Errorf("a create of a template with a ready sandbox: %d to %s: %s", code, to, body)
	}
	got := warm.requests()[0]
	if got.body != `{"templateID":"code-interpreter-v1"}` || got.header.Get("X-Api-Key") != routerKey {
		t.Errorf("the node got %q with key %q", got.body, got.header.Get("X-Api-Key"))
	}
	if code, to, _ := create("base"); code != http.StatusCreated || to != "idle" {
		t.Errorf("a create of a template no node has ready: %d to %s, want the less loaded", code, to)
	}
	for _, tc := range []struct {
		code    int
		body    string
		to      string
		relayed int
	}{
		{http.StatusTooManyRequests, `{"message":"full"}`, "warm,idle", http.StatusCreated},
		{http.StatusServiceUnavailable, `{"message":"shutting down"}`, "warm,idle", http.StatusCreated},
		{http.StatusBadRequest, `{"message":"unknown template \"code-interpreter-v1\""}`, "warm,idle", http.StatusCreated},
		{http.StatusBadRequest, `{"message":"timeout must be positive"}`, "warm", http.StatusBadRequest},
		{http.StatusInternalServerError, `{"message":"broken"}`, "warm", http.StatusInternalServerError},
	} {
		mu.Lock()
		answers["warm"] = struct {
			code int
			body string
		}{tc.code, tc.body}
		mu.Unlock()
		if code, to, _ := create("code-interpreter-v1"); code != tc.relayed || to != tc.to {
			t.Errorf("warm answers %d %s: %d via %s, want %d via %s", tc.code, tc.body, code, to, tc.relayed, tc.to)
		}
	}
	// Every node refuses: the last answer is the client's.
	mu.Lock()
	answers["idle"] = struct {
		code int
		body string
	}{http.StatusTooManyRequests, `{"message":"full too"}`}
	answers["warm"] = answers["idle"]
	mu.Unlock()
	if code, _, body := create("base"); code != http.StatusTooManyRequests || !strings.Contains(body, "full too") {
		t.Errorf("every node full: %d %s", code, body)
	}
	if code, _, body := rt.do(t, "POST", "/sandboxes", routerKey, strings.Repeat("x", maxBody+1), nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("an oversized create: %d %s", code, body)
	}
}

// TestRouterNoNodes: with no live node, a create is refused at once with
// a reason and a retry hint.
func TestRouterNoNodes(t *testing.T) {
	stale := newFakeNode(t, "stale", nil)
	rt := newTestRouter(t, fakeClient(registered("stale", stale.srv.URL, 0, nil, time.Now().Add(-time.Hour))...))
	code, hdr, body := rt.do(t, "POST", "/sandboxes", routerKey, `{}`, nil)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" || !strings.Contains(body, "no live Airlock node") {
		t.Errorf("no live node: %d %v %s", code, hdr, body)
	}
	if code, _, _ := rt.do(t, "GET", "/sandboxes/"+sandboxID("stale"), routerKey, "", nil); code != http.StatusNotFound {
		t.Errorf("a sandbox of a node whose lease ran out: %d", code)
	}
	if len(stale.requests()) != 0 {
		t.Errorf("the node whose lease ran out was sent %d requests", len(stale.requests()))
	}
}

// closedAddress is an address on loopback where nothing listens.
func closedAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + ln.Addr().String()
	ln.Close()
	return addr
}

// TestRouterNodeGone: a node whose address refuses connections is dead
// to the router until it renews its Lease: its sandboxes are not found,
// creates go elsewhere; a Lease deleted or renewed changes that at once.
func TestRouterNodeGone(t *testing.T) {
	up := newFakeNode(t, "up", nil)
	now := time.Now()
	client := fakeClient(append(
		registered("gone", closedAddress(t), 0, map[string]int64{"base": 3}, now),
		registered("up", up.srv.URL, 9, nil, now)...)...)
	rt := newTestRouter(t, client)
	// The ready pool draws the create to the dead node first: it is
	// never sent there, so it goes on to the next.
	if code, _, body := rt.do(t, "POST", "/sandboxes", routerKey, `{"templateID":"base"}`, nil); code != http.StatusOK || !strings.Contains(body, `"node":"up"`) {
		t.Errorf("a create while a node is gone: %d %s", code, body)
	}
	if got := liveNames(rt.Router); !slices.Equal(got, []string{"up"}) {
		t.Errorf("live nodes after a refused connection: %v", got)
	}
	if code, _, _ := rt.do(t, "GET", "/files", "", "", http.Header{"E2b-Sandbox-Id": {sandboxID("gone")}}); code != http.StatusNotFound {
		t.Errorf("a sandbox of the gone node: %d", code)
	}

	// The node renews its Lease: alive again, from the informer's event.
	renewed := leaseObject("gone", time.Now())
	informerEvent(t, rt.nodes, rt.nodes.leases, "gone", func() {
		if _, err := client.Resource(leasesResource).Namespace("airlock").Update(t.Context(), renewed, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	if got := liveNames(rt.Router); !slices.Equal(got, []string{"gone", "up"}) {
		t.Errorf("live nodes after the renewal: %v", got)
	}
	// A Lease deleted (a node that shut down) takes the node out.
	informerEvent(t, rt.nodes, rt.nodes.leases, "up", func() {
		if err := client.Resource(leasesResource).Namespace("airlock").Delete(t.Context(), "up", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	if got := liveNames(rt.Router); !slices.Equal(got, []string{"gone"}) {
		t.Errorf("live nodes after up's Lease went: %v", got)
	}
	if code, _, _ := rt.do(t, "GET", "/sandboxes/"+sandboxID("up"), routerKey, "", nil); code != http.StatusNotFound {
		t.Errorf("a sandbox of a node without a Lease: %d", code)
	}
	// A sandbox request that finds nothing at the node's address: 404,
	// and the node is dead again.
	if code, _, _ := rt.do(t, "GET", "/sandboxes/"+sandboxID("gone"), routerKey, "", nil); code != http.StatusNotFound {
		t.Errorf("a sandbox of the gone node, by path: %d", code)
	}
	if got := liveNames(rt.Router); len(got) != 0 {
		t.Errorf("live nodes: %v, want none", got)
	}
}

// informerEvent runs change, an update or a delete of the object name,
// and returns once inf has stored it and set's view is rebuilt: an
// informer updates its store before its handlers hear of a change, and
// rebuilds are ordered, so one made here reads at least what the
// router's own does.
func informerEvent(t *testing.T, set *nodeSet, inf cache.SharedIndexInformer, name string, change func()) {
	t.Helper()
	heard := make(chan struct{}, 1)
	notify := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok && u.GetName() != name {
			return
		}
		select {
		case heard <- struct{}{}:
		default:
		}
	}
	// Adds are left out: a new handler hears of every object there as one.
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: notify, UpdateFunc: func(_, o any) { notify(o) }})
	if err != nil {
		t.Fatal(err)
	}
	defer inf.RemoveEventHandler(reg)
	change()
	select {
	case <-heard:
	case <-t.Context().Done():
		t.Fatal("the informer did not hear of the change")
	}
	set.rebuild()
}

// volumeID is an id of a volume of node name (package volume's form).
func volumeID(name string) string { return IDPrefix(name) + "00-0000-4000-8000-000000000000" }

// TestRouterVolumes: a volume's requests reach its node (its files
// without the API key: the node checks the volume's token), the list is
// every node's, a new volume's name is checked against every node, and
// a sandbox that mounts volumes goes to their node.
func TestRouterVolumes(t *testing.T) {
	volumesOf := map[string]string{"node-a": `[{"volumeID":"` + volumeID("node-a") + `","name":"alpha"}]`, "node-b": `[{"volumeID":"` + volumeID("node-b") + `","name":"beta"}]`}
	handle := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == "GET" && r.URL.Path == "/volumes":
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, volumesOf[name])
			default:
				writeJSON(w, http.StatusCreated, map[string]string{"node": name, "path": r.URL.Path})
			}
		}
	}
	a, b := newFakeNode(t, "node-a", handle("node-a")), newFakeNode(t, "node-b", handle("node-b"))
	now := time.Now()
	// node-a has a ready pool: a plain create would go there.
	client := fakeClient(append(registered("node-a", a.srv.URL, 0, map[string]int64{"base": 2}, now), registered("node-b", b.srv.URL, 0, nil, now)...)...)
	rt := newTestRouter(t, client)

	code, _, body := rt.do(t, "GET", "/volumes", routerKey, "", nil)
	if code != http.StatusOK || !strings.Contains(body, `"alpha"`) || !strings.Contains(body, `"beta"`) {
		t.Errorf("list: %d %s", code, body)
	}
	if code, _, body := rt.do(t, "GET", "/volumes/"+volumeID("node-b"), routerKey, "", nil); code != http.StatusCreated || !strings.Contains(body, `"node":"node-b"`) {
		t.Errorf("a volume of node-b: %d %s", code, body)
	}
	if code, _, _ := rt.do(t, "GET", "/volumes/"+volumeID("node-c"), routerKey, "", nil); code != http.StatusNotFound {
		t.Errorf("a volume of no node: %d", code)
	}
	code, _, body = rt.do(t, "PUT", "/volumecontent/"+volumeID("node-a")+"/file?path=/x", "", "data", http.Header{"Authorization": {"Bearer vol_token"}})
	if seen := a.requests(); code != http.StatusCreated || seen[len(seen)-1].header.Get("Authorization") != "Bearer vol_token" || seen[len(seen)-1].body != "data" {
		t.Errorf("a volume's files, by its token: %d %s", code, body)
	}

	if code, _, body := rt.do(t, "POST", "/volumes", routerKey, `{"name":"beta"}`, nil); code != http.StatusBadRequest || !strings.Contains(body, "already exists") {
		t.Errorf("a name a node has: %d %s", code, body)
	}
	before := len(a.requests()) + len(b.requests())
	if code, _, _ := rt.do(t, "POST", "/volumes", routerKey, `{"name":"gamma"}`, nil); code != http.StatusCreated {
		t.Errorf("a new volume: %d", code)
	}
	posts := 0
	for _, s := range append(a.requests(), b.requests()...) {
		if s.method == "POST" && s.uri == "/volumes" {
			posts++
		}
	}
	if posts != 1 || len(a.requests())+len(b.requests()) != before+3 {
		t.Errorf("a new volume was posted to %d nodes", posts)
	}

	code, _, body = rt.do(t, "POST", "/sandboxes", routerKey, `{"templateID":"base","volumeMounts":[{"name":"beta","path":"/b"}]}`, nil)
	if code != http.StatusCreated || !strings.Contains(body, `"node":"node-b"`) {
		t.Errorf("a sandbox mounting node-b's volume: %d %s", code, body)
	}
	code, _, body = rt.do(t, "POST", "/sandboxes", routerKey, `{"templateID":"base","volumeMounts":[{"name":"alpha","path":"/a"},{"name":"beta","path":"/b"}]}`, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "different nodes") {
		t.Errorf("a sandbox mounting volumes of two nodes: %d %s", code, body)
	}
}
