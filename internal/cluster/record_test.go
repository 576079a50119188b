package cluster

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
)

func TestParseAddress(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "": refused
	}{
		{"http://10.0.0.5:49982", "http://10.0.0.5:49982"},
		{"http://10.0.0.5:49982/", "http://10.0.0.5:49982"},
		{"https://node-1.airlock.svc:443", "https://node-1.airlock.svc:443"},
		{"http://Node-1.Example", "http://Node-1.Example"},
		{"http://[fd00::5]:49982", "http://[fd00::5]:49982"},
		// What the CRD's first pattern (^https?://[^/\s]+/?$) let through.
		{"http://[::1", ""},         // url.Parse: missing ']': the router's nil URL
		{"http://%zz", ""},          // url.Parse: invalid escape
		{"http://host:port", ""},    // url.Parse: invalid port
		{"http://a\x7fb", ""},       // url.Parse: control character
		{"http://host:99999", ""},   // no such port
		{"http://host:0", ""},       // nor this
		{"http://host:", ""},        // nor an empty one
		{"http://host:080", ""},     // not canonical
		{"http://user:pw@host", ""}, // credentials for whoever answers
		{"http://host?x=1", ""},
		{"http://host#f", ""},
		{"http://", ""},
		{"http://:80", ""},
		{"http://[fe80::1%25eth0]:80", ""}, // a zone
		{"http://[10.0.0.1]:80", ""},       // IPv4 in brackets
		{"http://-host", ""},
		{"http://a..b", ""},
		{"http://a_b", ""},
		{"ftp://host", ""},
		{"host:80", ""},
		{"//host", ""},
		{"", ""},
		{"http://" + strings.Repeat("a", 300), ""},
	} {
		got, err := ParseAddress(tc.in)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("ParseAddress(%q) = %s, want it refused", tc.in, got)
		case tc.want != "" && err != nil:
			t.Errorf("ParseAddress(%q): %v, want %s", tc.in, err, tc.want)
		case tc.want != "" && got.String() != tc.want:
			t.Errorf("ParseAddress(%q) = %s, want %s", tc.in, got, tc.want)
		case err != nil && strings.Contains(err.Error(), "\n"):
			t.Errorf("ParseAddress(%q): %q is not one line", tc.in, err)
		}
	}
}

// A node whose record gives an address that Go cannot parse is left out
// of the router's nodes, and its sandboxes are not found; the router
// neither panics nor stops routing to the others.
func TestRouterSkipsUnparsableNode(t *testing.T) {
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "node good: "+r.URL.Path+" "+r.Header.Get("E2b-Sandbox-Id"))
	}))
	defer good.Close()
	nodes := &objects{}
	leases := &objects{}
	for name, address := range map[string]string{"good": good.URL, "bad": "http://[::1", "worse": "http://host:port"} {
		nodes.add(nodeObject(name, address))
		leases.add(leaseObject(name, time.Now()))
	}
	set := newNodeSet(nodes, leases, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := set.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	rt := newRouter(set, "key", "localhost", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if live := set.live(); len(live) != 1 || live[0].Name != "good" {
		t.Errorf("live nodes: %+v, want only good", live)
	}
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		t.Helper()
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, r)
		return w
	}
	for _, name := range []string{"bad", "worse"} {
		id := "i" + IDPrefix(name) + "0123456789abc"
		r := httptest.NewRequest("GET", "/sandboxes/"+id, nil)
		r.Header.Set("X-API-KEY", "key")
		if w := serve(r); w.Code != http.StatusNotFound {
			t.Errorf("a sandbox of node %s: %d %s, want 404", name, w.Code, w.Body)
		}
		r = httptest.NewRequest("GET", "/files", nil)
		r.Header.Set("E2b-Sandbox-Id", id)
		if w := serve(r); w.Code != http.StatusNotFound {
			t.Errorf("envd traffic of a sandbox of node %s: %d %s, want 404", name, w.Code, w.Body)
		}
	}
	id := "i" + IDPrefix("good") + "0123456789abc"
	r := httptest.NewRequest("GET", "/files", nil)
	r.Header.Set("E2b-Sandbox-Id", id)
	if w := serve(r); w.Code != http.StatusOK || w.Body.String() != "node good: /files "+id {
		t.Errorf("a sandbox of the good node: %d %q", w.Code, w.Body)
	}
}

// objects is a resource's objects as an informer lists and watches them:
// a fixed list, and a watch that tells of nothing new.
type objects struct {
	mu    sync.Mutex
	items []unstructured.Unstructured
}

func (o *objects) add(u *unstructured.Unstructured) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.items = append(o.items, *u)
}

func (o *objects) List(context.Context, metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List"}}
	for _, u := range o.items {
		list.Items = append(list.Items, *u.DeepCopy())
	}
	return list, nil
}

func (o *objects) Watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return watch.NewFake(), nil
}

// IsWatchListSemanticsUnSupported: the list is a list, not a stream of
// watch events.
func (o *objects) IsWatchListSemanticsUnSupported() bool { return true }

func nodeObject(name, address string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "AirlockNode",
		"metadata": map[string]any{"name": name, "namespace": "airlock"},
		"spec":     map[string]any{"address": address, "idPrefix": IDPrefix(name), "capacity": int64(10)},
	}}
}

func leaseObject(name string, renewed time.Time) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": name, "namespace": "airlock"},
		"spec":     map[string]any{"holderIdentity": name, "renewTime": microTime(renewed), "leaseDurationSeconds": int64(LeaseDuration / time.Second)},
	}}
}
