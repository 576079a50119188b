package agentproto

import (
	"errors"
	"strings"
	"testing"
)

func TestLookupUser(t *testing.T) {
	passwd := "root:x:0:0:root:/root:/bin/bash\n" +
		"node:x:1001:1002:Node:/home/node:/bin/sh\n" +
		"broken:x:nine:1:b:/b:/bin/sh\n" +
		"big:x:4294967296:1:b:/b:/bin/sh\n" +
		"short:x:5:5\n" +
		"relhome:x:7:7::home:/bin/sh\n"
	for _, tc := range []struct {
		name     string
		uid, gid int
		home     string
		err      string
	}{
		{"node", 1001, 1002, "/home/node", ""},
		{"root", 0, 0, "/root", ""},
		{"nobody", 0, 0, "", "no such user"},
		{"broken", 0, 0, "", "malformed"},
		{"big", 0, 0, "", "malformed"},
		{"short", 0, 0, "", "no such user"},
		{"relhome", 0, 0, "", "malformed"},
		{"a:b", 0, 0, "", "not a user name"},
		{"", 0, 0, "", "not a user name"},
	} {
		uid, gid, home, err := LookupUser(strings.NewReader(passwd), tc.name)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error naming %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || uid != tc.uid || gid != tc.gid || home != tc.home {
			t.Errorf("%q: %d %d %q %v, want %d %d %q", tc.name, uid, gid, home, err, tc.uid, tc.gid, tc.home)
		}
	}
	if _, _, _, err := LookupUser(strings.NewReader(""), "x"); !errors.Is(err, ErrNoUser) {
		t.Errorf("empty file: %v, want ErrNoUser", err)
	}
}

func TestValidUserName(t *testing.T) {
	for name, want := range map[string]bool{
		"user": true, "node": true, "_apt": true, "www-data": true, "a.b": true, "host$": true, "A1": true,
		"": false, "1abc": false, "-x": false, "a b": false, "a:b": false, "a/b": false, "$": false,
		strings.Repeat("a", 33): false, "ключ": false,
	} {
		if got := ValidUserName(name); got != want {
			t.Errorf("%q: %v, want %v", name, got, want)
		}
	}
}

// FuzzLookupUser: a sandbox's /etc/passwd, whatever it holds, gives the
// daemon (a build's COPY owner) either an error or the ids and absolute
// home of a well-formed line of exactly that name.
func FuzzLookupUser(f *testing.F) {
	f.Add("root:x:0:0:root:/root:/bin/sh\nnode:x:1001:1002::/home/node:/bin/sh\n", "node")
	f.Add("node:x:-1:1::/h:/bin/sh\n", "node")
	f.Add("node:x:1:1::h:/bin/sh\n", "node")
	f.Add("node:x:99999999999:1::/h:/bin/sh\nnode:x:1:1::/h:/bin/sh\n", "node")
	f.Add(strings.Repeat("a", 70000)+"\nnode:x:1:1::/h:/s\n", "node")
	f.Add("x:y\n", "x:y")
	f.Fuzz(func(t *testing.T, passwd, name string) {
		uid, gid, home, err := LookupUser(strings.NewReader(passwd), name)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("a two-line error: %q", err)
			}
			return
		}
		if !ValidUserName(name) || uid < 0 || gid < 0 || uint64(uid) > 1<<32-1 || uint64(gid) > 1<<32-1 || !strings.HasPrefix(home, "/") {
			t.Errorf("%q in %q: %d %d %q", name, passwd, uid, gid, home)
		}
		if !strings.Contains(passwd, name+":") {
			t.Errorf("%q found in %q, which has no such line", name, passwd)
		}
	})
}
