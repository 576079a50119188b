package cluster

import (
	"encoding/json"
	"net/http"
	"regexp"
	"testing"
)

func TestIDPrefix(t *testing.T) {
	p := IDPrefix("node-1")
	if !regexp.MustCompile(`^[0-9a-f]{6}$`).MatchString(p) {
		t.Fatalf("IDPrefix = %q, want six hex digits", p)
	}
	if IDPrefix("node-1") != p || IDPrefix("node-2") == p {
		t.Errorf("IDPrefix is not a function of the name alone")
	}
	for id, want := range map[string]string{
		"i" + p + "0123456789abc": p,
		"i0123456789abcdef012":    "012345",
		"iXYZ456789abcdef0123":    "", // not hex
		"i0123":                   "", // short
		"x0123456789abcdef012":    "",
		"":                        "",
	} {
		if got := prefixOf(id); got != want {
			t.Errorf("prefixOf(%q) = %q, want %q", id, got, want)
		}
	}
}

func TestPlacement(t *testing.T) {
	nodes := []node{
		{Name: "a", Capacity: 10, Sandboxes: 1, Ready: map[string]int{}},
		{Name: "b", Capacity: 10, Sandboxes: 5, Ready: map[string]int{"base": 1}},
		{Name: "c", Capacity: 10, Sandboxes: 0, Ready: map[string]int{}},
		{Name: "d", Capacity: 10, Sandboxes: 2, Ready: map[string]int{"base": 2}},
	}
	var got []string
	for _, n := range placement(nodes, "base") {
		got = append(got, n.Name)
	}
	// Ready pools first (the less loaded of them first), then by load.
	want := []string{"d", "b", "c", "a"}
	if len(got) != len(want) {
		t.Fatalf("placement = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("placement = %v, want %v", got, want)
		}
	}
}

func TestTryNext(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   bool
	}{
		{http.StatusCreated, `{}`, false},
		{http.StatusTooManyRequests, `{}`, true},
		{http.StatusServiceUnavailable, `{}`, true},
		{http.StatusBadRequest, `{"code":400,"message":"unknown template \"x\""}`, true},
		{http.StatusBadRequest, `{"code":400,"message":"timeout must be positive"}`, false},
		{http.StatusUnauthorized, `{}`, false},
		{http.StatusInternalServerError, `{}`, false},
	} {
		if got := tryNext(tc.status, []byte(tc.body)); got != tc.want {
			t.Errorf("tryNext(%d, %s) = %v, want %v", tc.status, tc.body, got, tc.want)
		}
	}
}

func TestWithDomain(t *testing.T) {
	out := withDomain([]byte(`{"sandboxID":"i1","domain":"localhost:1234","envdVersion":"0.2.0"}`), "router:80")
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got["domain"] != "router:80" || got["sandboxID"] != "i1" || got["envdVersion"] != "0.2.0" {
		t.Errorf("withDomain = %s", out)
	}
	// Without a domain, or not an object: unchanged.
	for _, in := range []string{`{"sandboxID":"i1"}`, `[1,2]`, `not json`} {
		if got := string(withDomain([]byte(in), "x")); got != in {
			t.Errorf("withDomain(%s) = %s, want it unchanged", in, got)
		}
	}
}
