package backend

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

func TestCheckSpec(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	bad := policy.Default()
	bad.MemoryBytes = -1
	withMount := func(src string) policy.Policy {
		p := policy.Default()
		p.Mounts = []policy.Mount{{Source: src, Target: "/mnt/data", ReadOnly: true}}
		return p
	}
	for _, tc := range []struct {
		name string
		spec Spec
		want string // "" for none
	}{
		{"ok", Spec{Policy: policy.Default(), Argv: []string{"true"}, Files: []File{{Name: "main.py"}}}, ""},
		{"bad policy", Spec{Policy: bad, Argv: []string{"true"}}, "memory"},
		{"no command", Spec{Policy: policy.Default()}, "no command"},
		{"empty file name", Spec{Policy: policy.Default(), Argv: []string{"true"}, Files: []File{{Name: ""}}}, "single path element"},
		{"dot", Spec{Policy: policy.Default(), Argv: []string{"true"}, Files: []File{{Name: "."}}}, "single path element"},
		{"dot dot", Spec{Policy: policy.Default(), Argv: []string{"true"}, Files: []File{{Name: ".."}}}, "single path element"},
		{"a path", Spec{Policy: policy.Default(), Argv: []string{"true"}, Files: []File{{Name: "a/b"}}}, "single path element"},
		{"a NUL", Spec{Policy: policy.Default(), Argv: []string{"true"}, Files: []File{{Name: "a\x00"}}}, "single path element"},
		{"a mount", Spec{Policy: withMount(dir), Argv: []string{"true"}}, ""},
		{"a mount through a link", Spec{Policy: withMount(link), Argv: []string{"true"}}, "symbolic link"},
		{"a mount of nothing", Spec{Policy: withMount(filepath.Join(dir, "nope")), Argv: []string{"true"}}, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckSpec(&tc.spec)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("CheckSpec: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("CheckSpec: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestCheckNetNS(t *testing.T) {
	ns, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	none, net := policy.Default(), policy.Default()
	net.Network.Mode = policy.NetInternet
	for _, tc := range []struct {
		name  string
		p     policy.Policy
		netns *os.File
		ok    bool
	}{
		{"no network, no namespace", none, nil, true},
		{"a network in its namespace", net, ns, true},
		{"a namespace without a network", none, ns, false},
		{"a network without a namespace", net, nil, false},
	} {
		if err := CheckNetNS(&tc.p, tc.netns); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestErrorWords(t *testing.T) {
	if got := (&StateError{Reason: "is corrupt"}).Error(); got != "the saved state is corrupt" {
		t.Errorf("StateError: %q", got)
	}
	if got := (&SetupError{Msg: "no cgroup"}).Error(); got != "sandbox setup failed: no cgroup" {
		t.Errorf("SetupError: %q", got)
	}
	if !errors.Is(ErrUnsupported, ErrUnsupported) || ErrUnsupported.Error() == "" {
		t.Error("ErrUnsupported")
	}
}

// A box id handed over is checked before a path is made of it: only what
// NewBoxID makes passes.
func TestBoxIDs(t *testing.T) {
	id, err := NewBoxID()
	if err != nil || !IsBoxID(id) {
		t.Fatalf("NewBoxID: %q %v, not a box id", id, err)
	}
	for _, bad := range []string{"", "../../etc/passwd", "0123456789abcdeF", "0123456789abcde", "0123456789abcdef0", "0123456789abcd/f"} {
		if IsBoxID(bad) {
			t.Errorf("%q taken for a box id", bad)
		}
	}
}
