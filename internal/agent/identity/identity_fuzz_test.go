package identity

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzResolve: a request's user is "user", or "root" or a user of the
// image's passwd file where the agent is root, or refused; a client path resolves to a clean absolute path, "~"
// and relative paths to the user's home, and a local one (no "..", not
// absolute) never leaves that home.
func FuzzResolve(f *testing.F) {
	for _, p := range []string{
		"", "~", "~/", "~/a/b", "~/../../etc/passwd", "~root", "~user/x", "a", "a/../b", "../x", "../../../../etc/shadow",
		"/", "/etc/passwd", "//etc//passwd/", "/home/user/../../etc", ".", "./.", "a\x00b", "ключ/値", "~/" + strings.Repeat("a/", 500),
	} {
		f.Add("", p, false)
	}
	for _, u := range []string{"user", "root", "Root", " user", "nobody", "user\x00", "ユーザー"} {
		f.Add(u, "~/f", true)
		f.Add(u, "f", false)
	}
	passwd := filepath.Join(f.TempDir(), "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nnode:x:1001:1001::/home/node:/bin/sh\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Add("node", "~/f", true)
	f.Fuzz(func(t *testing.T, user, p string, root bool) {
		u := Users{Home: "/home/user", Root: root, Passwd: passwd}
		r := httptest.NewRequest("GET", "/files", nil)
		r.SetBasicAuth(user, "")
		id, err := u.Who(r)
		name, _, _ := strings.Cut(user, ":") // Basic authorization's user ends at the first colon
		switch {
		case name == "" || name == "user":
			if err != nil || id != u.User() {
				t.Fatalf("user %q: got %+v, %v, want the sandbox user", user, id, err)
			}
		case name == "root" && root:
			if err != nil || id != Root {
				t.Fatalf("root in an agent that is root: got %+v, %v", id, err)
			}
		case name == "node" && root:
			if err != nil || id != (ID{"node", 1001, 1001, "/home/node"}) {
				t.Fatalf("the image's node in an agent that is root: got %+v, %v", id, err)
			}
		default:
			if err == nil {
				t.Fatalf("user %q (agent root: %v) was taken as %+v", user, root, id)
			}
			return
		}
		got := id.Resolve(p)
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Fatalf("%q resolved to %q: not a clean absolute path", p, got)
		}
		rel, home := strings.CutPrefix(p, "~/")
		if p == "~" {
			rel, home = ".", true
		}
		if !home && !filepath.IsAbs(p) {
			rel, home = p, true
		}
		if home && filepath.IsLocal(rel) && got != id.Home && !strings.HasPrefix(got, id.Home+"/") {
			t.Errorf("%q as %s resolved to %q, outside the home %s", p, id.Name, got, id.Home)
		}
		if !home && got != filepath.Clean(p) {
			t.Errorf("the absolute %q resolved to %q", p, got)
		}
	})
}
