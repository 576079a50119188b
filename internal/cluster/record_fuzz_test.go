package cluster

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// An AirlockNode is written by anyone who may write AirlockNodes: the
// router's parser of node records never panics, and a record it takes
// is one it can route to (its address parses again to itself, and the
// proxy can aim a request at it).
func FuzzParseNode(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"airlock-sandbox.github.io/v1alpha1","kind":"AirlockNode","metadata":{"name":"node-1"},"spec":{"address":"http://10.0.0.5:49982","idPrefix":"abcdef","capacity":8},"status":{"sandboxes":3,"pools":[{"template":"base","size":2,"ready":1}]}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":{"address":"https://[fd00::1]:443/"}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":{"address":"http://[::1"}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":{"address":"http://host:port"}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":{"address":"http://%zz"}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":{"address":"http://u:p@h:1"}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":{"address":7}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":{"address":"http://h","capacity":-5},"status":{"sandboxes":-1,"pools":[7,{"template":3,"ready":"x"},{"template":"t","ready":-2}]}}`,
		`{"kind":"AirlockNode","metadata":{"name":"n"},"spec":"nothing","status":[]}`,
		`{"kind":"AirlockNode"}`,
	} {
		f.Add([]byte(s))
	}
	lease := leaseObject("n", time.Now())
	f.Fuzz(func(t *testing.T, data []byte) {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			return
		}
		k, err := parseNode(u, lease)
		if err != nil {
			return
		}
		again, err := ParseAddress(k.Address)
		if err != nil || again.String() != k.Address || k.target == nil || k.target.String() != k.Address {
			t.Fatalf("node %s's address %q is not what it parses to: %v, %v", k.Name, k.Address, again, err)
		}
		if k.Prefix != IDPrefix(u.GetName()) {
			t.Fatalf("prefix %q, not the name's", k.Prefix)
		}
		if k.Capacity < 0 || k.Sandboxes < 0 {
			t.Fatalf("capacity %d, sandboxes %d", k.Capacity, k.Sandboxes)
		}
		for tmpl, r := range k.Ready {
			if r < 0 {
				t.Fatalf("ready[%q] = %d", tmpl, r)
			}
		}
		// As the router sends to it: by its address, and through the proxy.
		if _, err := http.NewRequest(http.MethodGet, k.Address+"/sandboxes/x?y=1", nil); err != nil {
			t.Fatalf("a request to %q: %v", k.Address, err)
		}
		in, _ := http.NewRequest(http.MethodGet, "http://router/files?path=/x", nil)
		pr := &httputil.ProxyRequest{In: in, Out: in.Clone(in.Context())}
		pr.SetURL(k.target)
		if want, _ := url.Parse(k.Address); pr.Out.URL.Host != want.Host || pr.Out.URL.Scheme != want.Scheme {
			t.Fatalf("the proxy aims at %s, not %s", pr.Out.URL, k.Address)
		}
	})
}

// ParseAddress alone, where the fuzzer mutates the address itself.
func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{"http://10.0.0.5:49982", "https://node-1.airlock.svc/", "http://[fd00::5]:1",
		"http://[::1", "http://%zz", "http://host:port", "http://host:99999", "http://u@h", "http://h?q#f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseAddress(s)
		if err != nil {
			return
		}
		again, err := url.Parse(u.String())
		if err != nil || again.String() != u.String() || again.Hostname() == "" || again.User != nil || again.Path != "" {
			t.Fatalf("ParseAddress(%q) = %s, which parses to %v, %v", s, u, again, err)
		}
		if _, err := http.NewRequest(http.MethodGet, u.String()+"/sandboxes", nil); err != nil {
			t.Fatalf("ParseAddress(%q) = %s: a request to it: %v", s, u, err)
		}
	})
}
