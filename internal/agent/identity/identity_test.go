package identity

import (
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

func TestWho(t *testing.T) {
	user := User
	user.Home = "/home/u"
	for _, tc := range []struct {
		name   string
		basic  string // Basic authorization's user; "-" for none
		query  string // ?username=
		root   bool
		want   ID
		refuse string // in the error's message
	}{
		{"nobody named", "-", "", false, user, ""},
		{"user", "user", "", false, user, ""},
		{"user in the query", "-", "user", false, user, ""},
		{"root where the agent is root", "root", "", true, Root, ""},
		{"root in the query", "-", "root", true, Root, ""},
		{"root where it is not", "root", "", false, ID{}, `"root" is not available in this sandbox`},
		{"someone else, no root", " nobody ", "", false, ID{}, `user "nobody" is not available: this sandbox has "user"`},
		{"authorization wins over the query", "user", "root", true, user, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/files?username="+tc.query, nil)
			if tc.basic != "-" {
				r.SetBasicAuth(tc.basic, "")
			}
			got, err := Users{Home: "/home/u", Root: tc.root}.Who(r)
			if tc.refuse != "" {
				var e *agentproto.Error
				if !errors.As(err, &e) || e.Code != agentproto.CodePermissionDenied || !strings.Contains(e.Message, tc.refuse) {
					t.Errorf("got %+v, %v; want permission_denied with %q", got, err, tc.refuse)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// Where the agent is root (an image's sandbox), every user of the image
// is there, as on E2B; one the image lacks is refused as envd refuses it.
func TestWhoAnyUserOfTheImage(t *testing.T) {
	passwd := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nnode:x:1001:1002::/home/node:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]ID{"node": {"node", 1001, 1002, "/home/node"}, "mallory": {}, "x y": {}, "nobody": {}} {
		r := httptest.NewRequest("GET", "/files", nil)
		r.SetBasicAuth(name, "")
		got, err := Users{Home: "/home/user", Root: true, Passwd: passwd}.Who(r)
		if want.Name == "" {
			var e *agentproto.Error
			if !errors.As(err, &e) || e.Code != agentproto.CodeUnauthenticated || !strings.HasPrefix(e.Message, "invalid username: '"+name+"'") {
				t.Errorf("%q: %+v, %v; want unauthenticated, invalid username", name, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", name, got, err, want)
		}
	}
	// Without root, the image's users are not the agent's to act as.
	r := httptest.NewRequest("GET", "/files", nil)
	r.SetBasicAuth("node", "")
	if _, err := (Users{Home: "/home/user", Passwd: passwd}).Who(r); err == nil {
		t.Error("node without a root agent: no error")
	}
}

func TestResolve(t *testing.T) {
	id := ID{Name: "user", Home: "/home/user"}
	for p, want := range map[string]string{
		"": "/home/user", "~": "/home/user", "~/": "/home/user", "~/a/../b": "/home/user/b", "a/b": "/home/user/a/b",
		"../x": "/home/x", "/etc//passwd/": "/etc/passwd", "/": "/", "~root": "/home/user/~root", ".": "/home/user",
	} {
		if got := id.Resolve(p); got != want {
			t.Errorf("%q resolved to %q, want %q", p, got, want)
		}
	}
}

func TestCredential(t *testing.T) {
	root, plain := Users{Home: "/h", Root: true}, Users{Home: "/h"}
	want := &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{1000}}
	if got := root.Credential(root.User()); !reflect.DeepEqual(got, want) {
		t.Errorf("an agent that is root, for the user: %+v, want %+v", got, want)
	}
	for name, got := range map[string]*syscall.Credential{
		"root agent, for root":      root.Credential(Root),
		"plain agent, for the user": plain.Credential(plain.User()),
		"plain agent, for root":     plain.Credential(Root),
	} {
		if got != nil {
			t.Errorf("%s: %+v, want none: the process runs as the agent", name, got)
		}
	}
}

// TestAsWithoutRoot: an agent that is not root runs f as itself, on the
// caller's goroutine, and returns f's error.
func TestAsWithoutRoot(t *testing.T) {
	mine := errors.New("f's own")
	ran := false
	err := Users{Home: "/h"}.As(User, func() error { ran = true; return mine })
	if !ran || err != mine {
		t.Errorf("ran %v, got %v; want f's error", ran, err)
	}
}

// TestAsFailsClosed: where the thread cannot take id's identity, f does
// not run (as root it can, which thread_test.go checks).
func TestAsFailsClosed(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("as root the thread can act as anyone")
	}
	ran := false
	err := Users{Home: "/h", Root: true}.As(User, func() error { ran = true; return nil })
	var e *agentproto.Error
	if ran || !errors.As(err, &e) || e.Code != agentproto.CodeInternal || !strings.HasPrefix(e.Message, "cannot act as user") {
		t.Errorf("ran %v, got %v; want f not run and an internal error", ran, err)
	}
}
