package cluster

import (
	"context"
	"encoding/json"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// Two AirlockTemplates that make one template name: the older is built,
// once, however many times the node looks again; the other is not built
// and says why in its status, the same on every write; when the older
// goes, the other is built, once, and its condition goes.
func TestTemplateNameConflict(t *testing.T) {
	api := newBuildAPI(t)
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	st := &statusWriter{store: store}
	n := &Node{cfg: NodeConfig{Namespace: "airlock", Local: &LocalAPI{URL: api.URL, Key: "k"}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		templates: newTemplates(), templateStatus: st}
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	store.Add(templateObject("hello", "", "uid-1", t0, "img-a"))
	store.Add(templateObject("hello-again", "hello:default", "uid-2", t0.Add(time.Second), "img-b"))
	store.Add(templateObject("zz", "hello", "uid-3", t0, "img-c")) // as old as hello: the name decides
	store.Add(templateObject("other", "other:v2", "uid-4", t0.Add(time.Minute), "img-d"))

	// The node looks every second, and at each change of any object.
	settle := func() {
		t.Helper()
		for range 5 {
			n.applyTemplates(t.Context(), store)
		}
		for i := 0; ; i++ {
			n.applyTemplates(t.Context(), store)
			if !slices.ContainsFunc(n.templates.statuses(), func(s TemplateStatus) bool { return s.Phase == "building" }) {
				break
			}
			if i > 100 {
				t.Fatalf("builds did not end (started anew at each look?): %+v", n.templates.statuses())
			}
			time.Sleep(100 * time.Millisecond)
		}
		for range 5 {
			n.applyTemplates(t.Context(), store)
		}
	}
	settle()
	if got, want := api.builds(), []string{"hello from img-a", "other:v2 from img-d"}; !slices.Equal(got, want) {
		t.Errorf("builds: %q, want %q", got, want)
	}
	// Each says which of the node's own builds made it: a router shows
	// that build's log.
	if got := n.templates.statuses(); len(got) != 2 || got[0].Name != "hello" || got[0].Phase != "ready" || got[1].Name != "other:v2" ||
		got[0].LocalBuildID == "" || got[0].LocalBuildID == got[1].LocalBuildID {
		t.Errorf("the node's template statuses: %+v", got)
	}
	for _, name := range []string{"hello-again", "zz"} {
		if c := conflictOf(t, store, name); !strings.Contains(c, `AirlockTemplate "hello", which is older, makes template "hello" too`) {
			t.Errorf("%s's NameConflict: %q", name, c)
		}
	}
	for _, name := range []string{"hello", "other"} {
		if c := conflictOf(t, store, name); c != "" {
			t.Errorf("%s, which is built, has a NameConflict: %q", name, c)
		}
	}
	if st.count() != 2 {
		t.Errorf("%d status writes for two objects not built: an unchanged status is written again", st.count())
	}

	// The older one goes: the next by age and name is built, once.
	obj, _, _ := store.GetByKey("airlock/hello")
	store.Delete(obj)
	settle()
	if got, want := api.builds(), []string{"hello from img-a", "hello from img-c", "other:v2 from img-d"}; !slices.Equal(got, want) {
		t.Errorf("builds: %q, want %q", got, want)
	}
	if c := conflictOf(t, store, "zz"); c != "" {
		t.Errorf("zz is built, and still has a NameConflict: %q", c)
	}
	if c := conflictOf(t, store, "hello-again"); !strings.Contains(c, `AirlockTemplate "zz"`) {
		t.Errorf("hello-again's NameConflict: %q", c)
	}

	// Removing an object removes its tag alone: other:v2 is not other.
	for _, key := range store.ListKeys() {
		obj, _, _ := store.GetByKey(key)
		store.Delete(obj)
	}
	settle()
	if got, want := api.removals(), []string{"hello [default]", "other [v2]"}; !slices.Equal(got, want) {
		t.Errorf("removals: %q, want %q", got, want)
	}
}

// Every node picks the same winner, whatever order its informer lists
// the objects in.
func TestChooseTemplatesOrder(t *testing.T) {
	t0 := time.Now().Truncate(time.Second)
	objs := []any{
		templateObject("b", "x", "u1", t0, ""),
		templateObject("a", "x:default", "u2", t0, ""),
		templateObject("c", "x", "u3", t0.Add(-time.Second), ""),
		templateObject("d", "x:v1", "u4", t0, ""),
	}
	for i := range 8 {
		shuffled := slices.Clone(objs)
		if i%2 == 1 {
			slices.Reverse(shuffled)
		}
		shuffled[0], shuffled[i%len(shuffled)] = shuffled[i%len(shuffled)], shuffled[0]
		chosen, losers := chooseTemplates(shuffled)
		if chosen["x"].GetName() != "c" || chosen["x:v1"].GetName() != "d" || len(chosen) != 2 {
			t.Fatalf("order %d: chose %v", i, chosen)
		}
		var names []string
		for _, l := range losers {
			names = append(names, l.loser.GetName()+"<"+l.winner.GetName())
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"a<c", "b<c"}) {
			t.Fatalf("order %d: losers %v", i, names)
		}
	}
}

func templateObject(name, tmpl, uid string, created time.Time, image string) *unstructured.Unstructured {
	spec := map[string]any{"fromImage": image}
	if tmpl != "" {
		spec["name"] = tmpl
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "AirlockTemplate",
		"metadata": map[string]any{"name": name, "namespace": "airlock"},
		"spec":     spec,
	}}
	u.SetUID(types.UID(uid))
	u.SetGeneration(1)
	u.SetCreationTimestamp(metav1.NewTime(created))
	return u
}

// conflictOf is the message of the NameConflict condition of object name.
func conflictOf(t *testing.T, store cache.Store, name string) string {
	t.Helper()
	obj, ok, _ := store.GetByKey("airlock/" + name)
	if !ok {
		t.Fatalf("no object %s", name)
	}
	conds, _, _ := unstructured.NestedSlice(obj.(*unstructured.Unstructured).Object, "status", "conditions")
	for _, c := range conds {
		if m := c.(map[string]any); m["type"] == "NameConflict" {
			return m["message"].(string)
		}
	}
	return ""
}

// statusWriter is the API server's status subresource, as far as a node
// writes it: a merge patch of status.conditions, which the informer's
// store then holds.
type statusWriter struct {
	mu     sync.Mutex
	store  cache.Store
	writes int
}

func (s *statusWriter) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

func (s *statusWriter) Patch(_ context.Context, name string, pt types.PatchType, data []byte, _ metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if pt != types.MergePatchType || !slices.Equal(sub, []string{"status"}) {
		return nil, fmt.Errorf("patch %s %v", pt, sub)
	}
	obj, ok, _ := s.store.GetByKey("airlock/" + name)
	if !ok {
		return nil, fmt.Errorf("no %s", name)
	}
	var patch struct {
		Status struct {
			Conditions []any `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(data, &patch); err != nil {
		return nil, err
	}
	// As the API server stores it: integers as int64.
	var conds []any
	for _, c := range patch.Status.Conditions {
		m := c.(map[string]any)
		if g, ok := m["observedGeneration"].(float64); ok {
			m["observedGeneration"] = int64(g)
		}
		conds = append(conds, m)
	}
	u := obj.(*unstructured.Unstructured).DeepCopy()
	unstructured.SetNestedSlice(u.Object, conds, "status", "conditions")
	s.store.Update(u)
	return u, nil
}

// buildAPI plays a node's build API: each build is ready at its first
// status, and the builds and removals asked of it are recorded.
type buildAPI struct {
	*httptest.Server
	mu               sync.Mutex
	started, removed []string
	names            map[string]string // buildID: template name
}

func newBuildAPI(t *testing.T) *buildAPI {
	a := &buildAPI{names: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/templates", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Name string }
		json.NewDecoder(r.Body).Decode(&req)
		a.mu.Lock()
		id := fmt.Sprintf("b%d", len(a.names))
		a.names[id] = req.Name
		a.mu.Unlock()
		tmpl, _, _ := strings.Cut(req.Name, ":")
		json.NewEncoder(w).Encode(map[string]string{"templateID": tmpl, "buildID": id})
	})
	mux.HandleFunc("POST /v2/templates/{id}/builds/{build}", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ FromImage string }
		json.NewDecoder(r.Body).Decode(&req)
		a.mu.Lock()
		a.started = append(a.started, a.names[r.PathValue("build")]+" from "+req.FromImage)
		a.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("GET /templates/{id}/builds/{build}/status", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"status":"ready"}`)
	})
	mux.HandleFunc("DELETE /templates/tags", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Name string
			Tags []string
		}
		json.NewDecoder(r.Body).Decode(&req)
		a.mu.Lock()
		a.removed = append(a.removed, fmt.Sprintf("%s %v", req.Name, req.Tags))
		a.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	a.Server = httptest.NewServer(mux)
	t.Cleanup(a.Close)
	return a
}

// builds are the builds started, sorted (they run at once).
func (a *buildAPI) builds() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := slices.Clone(a.started)
	slices.Sort(out)
	return out
}

func (a *buildAPI) removals() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := slices.Clone(a.removed)
	slices.Sort(out)
	return out
}
