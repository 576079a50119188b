package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// samePrefix returns two node names whose sandbox ids share a prefix.
func samePrefix(t *testing.T) (string, string) {
	t.Helper()
	seen := map[string]string{}
	for i := range 1 << 20 {
		name := fmt.Sprintf("node-%d", i)
		p := IDPrefix(name)
		if other, ok := seen[p]; ok {
			return other, name
		}
		seen[p] = name
	}
	t.Fatal("no two names share a prefix")
	return "", ""
}

func nodeConfig(name, address string) NodeConfig {
	return NodeConfig{Name: name, Namespace: "airlock", Address: address, Backends: []string{"namespaces", "gvisor"},
		Capacity: 20, Log: slog.New(slog.DiscardHandler)}
}

func getObject(t *testing.T, c *fakeDynamic, kind, name string) *unstructured.Unstructured {
	t.Helper()
	r := nodesResource
	if kind == "Lease" {
		r = leasesResource
	}
	u, err := c.Resource(r).Namespace("airlock").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
	return u
}

// TestRegister: a node makes its AirlockNode and Lease, as routers read
// them; a daemon restarted on the node takes them over; a name whose
// prefix a live node has is refused, changing nothing.
func TestRegister(t *testing.T) {
	c := fakeClient()
	if _, err := Register(t.Context(), c, nodeConfig("node-1", "http://10.0.0.1:49982")); err != nil {
		t.Fatal(err)
	}
	u, lease := getObject(t, c, "AirlockNode", "node-1"), getObject(t, c, "Lease", "node-1")
	k, err := parseNode(u, lease)
	if err != nil {
		t.Fatal(err)
	}
	if k.Address != "http://10.0.0.1:49982" || k.Prefix != IDPrefix("node-1") || k.Capacity != 20 || !k.expires.After(time.Now()) {
		t.Errorf("the router reads the registration as %+v, expiring %s", k.node, k.expires)
	}
	if got, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "backends"); !slices.Equal(got, []string{"namespaces", "gvisor"}) {
		t.Errorf("backends: %v", got)
	}
	if u.GetLabels()["app.kubernetes.io/component"] != "node" {
		t.Errorf("labels: %v", u.GetLabels())
	}
	// Restarted with another address: the same objects, updated.
	if _, err := Register(t.Context(), c, nodeConfig("node-1", "http://10.0.0.2:49982")); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(getObject(t, c, "AirlockNode", "node-1").Object, "spec", "address"); got != "http://10.0.0.2:49982" {
		t.Errorf("address after a second registration: %q", got)
	}

	first, second := samePrefix(t)
	if _, err := Register(t.Context(), c, nodeConfig(first, "http://10.0.0.3:49982")); err != nil {
		t.Fatal(err)
	}
	_, err = Register(t.Context(), c, nodeConfig(second, "http://10.0.0.4:49982"))
	if want := fmt.Sprintf("node name %q gives sandbox ids the prefix %s, as live node %q does: choose another name", second, IDPrefix(second), first); err == nil || err.Error() != want {
		t.Errorf("a name whose prefix a live node has: %v, want %q", err, want)
	}
	if _, err := c.Resource(nodesResource).Namespace("airlock").Get(t.Context(), second, metav1.GetOptions{}); err == nil {
		t.Error("the refused node was registered")
	}
	// Once the other's Lease has run out, the name is free.
	if _, err := c.Resource(leasesResource).Namespace("airlock").Update(t.Context(), leaseObject(first, time.Now().Add(-time.Hour)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Register(t.Context(), c, nodeConfig(second, "http://10.0.0.4:49982")); err != nil {
		t.Errorf("a prefix whose node's Lease ran out: %v", err)
	}
}

// TestPublish: the node's load goes into its AirlockNode's status, where
// routers place by it; a node whose object an operator deleted makes it
// again; deregistering removes both objects.
func TestPublish(t *testing.T) {
	c := fakeClient()
	n, err := Register(t.Context(), c, nodeConfig("node-1", "http://10.0.0.1:49982"))
	if err != nil {
		t.Fatal(err)
	}
	st := NodeStatus{Sandboxes: 3, Pools: []PoolStatus{{Template: "base", Size: 2, Ready: 1}}, Templates: []TemplateStatus{}}
	if err := n.publish(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	k, err := parseNode(getObject(t, c, "AirlockNode", "node-1"), getObject(t, c, "Lease", "node-1"))
	if err != nil || k.Sandboxes != 3 || k.Ready["base"] != 1 {
		t.Errorf("the router reads the status as %+v (%v)", k.node, err)
	}
	if err := c.Resource(nodesResource).Namespace("airlock").Delete(t.Context(), "node-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := n.publish(t.Context(), st); err == nil || !strings.Contains(err.Error(), "made again") {
		t.Errorf("publish after the object was deleted: %v", err)
	}
	if got, _, _ := unstructured.NestedString(getObject(t, c, "AirlockNode", "node-1").Object, "spec", "address"); got != "http://10.0.0.1:49982" {
		t.Errorf("the object made again has address %q", got)
	}
	n.deregister()
	for _, r := range []string{"AirlockNode", "Lease"} {
		gvr := nodesResource
		if r == "Lease" {
			gvr = leasesResource
		}
		if _, err := c.Resource(gvr).Namespace("airlock").Get(t.Context(), "node-1", metav1.GetOptions{}); err == nil {
			t.Errorf("the %s is still there after deregister", r)
		}
	}
}

func poolObject(name, template string, size any) *unstructured.Unstructured {
	spec := map[string]any{"template": template}
	if size != nil {
		spec["size"] = size
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "AirlockPool",
		"metadata": map[string]any{"name": name, "namespace": "airlock"}, "spec": spec,
	}}
}

func TestWantedPools(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, p := range []*unstructured.Unstructured{
		poolObject("a", "base", int64(2)),
		poolObject("b", "base", int64(5)), // the largest wins
		poolObject("c", "code-interpreter-v1", int64(0)),
		poolObject("d", "", int64(3)), // no template
		poolObject("e", "other", nil), // no size
		poolObject("f", "other", int64(-1)),
	} {
		store.Add(p)
	}
	got := wantedPools(store)
	if len(got) != 2 || got["base"] != 5 || got["code-interpreter-v1"] != 0 {
		t.Errorf("wantedPools = %v", got)
	}
}

// localAPI is a node daemon's own API for its registration: pool sizes
// are set through it (written down here) and its load read from it.
type localAPI struct {
	srv  *httptest.Server
	mu   sync.Mutex
	sent []string
	fail bool
}

func newLocalAPI(t *testing.T) *localAPI {
	l := &localAPI{}
	l.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-KEY") != "node-key" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		l.mu.Lock()
		defer l.mu.Unlock()
		if r.Method == http.MethodGet {
			io.WriteString(w, `{"running":4,"pools":[{"template":"base","size":2,"ready":2}]}`)
			return
		}
		if l.fail {
			http.Error(w, `{"message":"no such template"}`, http.StatusBadRequest)
			return
		}
		l.sent = append(l.sent, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(body)))
	}))
	t.Cleanup(l.srv.Close)
	return l
}

func (l *localAPI) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sent
	l.sent = nil
	return s
}

// TestApplyPools: the node sets what the AirlockPools ask, once; a size
// it could not set is tried again; a template no longer named goes back
// to the node's own configuration.
func TestApplyPools(t *testing.T) {
	api := newLocalAPI(t)
	n := &Node{cfg: nodeConfig("node-1", "http://10.0.0.1:49982"), applied: map[string]int{}}
	n.cfg.Local = &LocalAPI{URL: api.srv.URL, Key: "node-key"}
	n.applyPools(t.Context(), map[string]int{"base": 2, "my template": 1})
	if got := api.take(); !slices.Equal(got, []string{`PUT /airlock/pools/base {"size":2}`, `PUT /airlock/pools/my template {"size":1}`}) {
		t.Errorf("first: %q", got)
	}
	n.applyPools(t.Context(), map[string]int{"base": 2, "my template": 1})
	if got := api.take(); len(got) != 0 {
		t.Errorf("unchanged sizes sent again: %q", got)
	}
	api.mu.Lock()
	api.fail = true
	api.mu.Unlock()
	n.applyPools(t.Context(), map[string]int{"base": 3, "my template": 1})
	api.mu.Lock()
	api.fail = false
	api.mu.Unlock()
	n.applyPools(t.Context(), map[string]int{"base": 3})
	if got := api.take(); !slices.Equal(got, []string{`PUT /airlock/pools/base {"size":3}`, `DELETE /airlock/pools/my template`}) {
		t.Errorf("after a refusal and a removal: %q", got)
	}
	st, err := n.cfg.Local.status(t.Context())
	if err != nil || st.Sandboxes != 4 || len(st.Pools) != 1 || st.Pools[0] != (PoolStatus{Template: "base", Size: 2, Ready: 2}) || st.Templates == nil {
		t.Errorf("status: %+v %v", st, err)
	}
	n.cfg.Local.Key = "wrong"
	if _, err := n.cfg.Local.status(t.Context()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("status with a wrong key: %v", err)
	}
}
