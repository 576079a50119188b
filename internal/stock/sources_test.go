package stock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSources(t *testing.T) {
	tests := []struct {
		name              string
		files             map[string]string
		suite, mirror     string
		wantIn, wantNotIn []string
		err               string
	}{
		{
			name: "deb822 with security and a third party's repository",
			files: map[string]string{
				"sources.list.d/debian.sources": "Types: deb\n# a comment\nURIs: http://mirror.test/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n" +
					"Types: deb\nURIs: http://security.test/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
				"sources.list.d/other.sources":                "Types: deb\nURIs: http://other.test/node\nSuites: nodistro\nComponents: main\nSigned-By: /usr/share/keyrings/other.gpg\n",
				"sources.list.d/old.sources.disabled-by-farm": "Types: deb\nURIs: http://disabled.test/\nSuites: stable\n",
			},
			suite: "bookworm", mirror: "http://mirror.test/debian",
			wantIn:    []string{"URIs: http://mirror.test/debian\nSuites: bookworm bookworm-updates", "Suites: bookworm-security"},
			wantNotIn: []string{"other.test", "disabled.test"},
		},
		{
			name:  "one-line style, source entries and options",
			files: map[string]string{"sources.list": "deb-src http://src.test/debian trixie main\n# deb http://commented.test/ trixie main\ndeb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://m.test/debian trixie main contrib\ndeb [signed-by=/etc/apt/x.gpg] http://x.test/ trixie main\n"},
			suite: "trixie", mirror: "http://m.test/debian",
			wantIn: []string{"Components: main contrib"}, wantNotIn: []string{"src.test", "commented.test", "x.test"},
		},
		{name: "no sources", files: map[string]string{}, err: "name no Debian release"},
		{name: "a disabled stanza only", files: map[string]string{"sources.list.d/d.sources": "Enabled: no\nTypes: deb\nURIs: http://m.test/\nSuites: bookworm\n"}, err: "name no Debian release"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "etc/apt/sources.list.d"), 0o755)
			for name, data := range tt.files {
				if err := os.WriteFile(filepath.Join(root, "etc/apt", name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s, err := readSources(root)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.suite != tt.suite || s.mirror != tt.mirror {
				t.Errorf("got suite %q mirror %q, want %q %q", s.suite, s.mirror, tt.suite, tt.mirror)
			}
			out := string(s.deb822())
			for _, w := range tt.wantIn {
				if !strings.Contains(out, w) {
					t.Errorf("the root's sources lack %q:\n%s", w, out)
				}
			}
			for _, w := range tt.wantNotIn {
				if strings.Contains(out, w) {
					t.Errorf("the root's sources have %q:\n%s", w, out)
				}
			}
			if !strings.Contains(out, "Signed-By: "+debianKeyring) {
				t.Errorf("the root's sources are not signed by Debian's keyring:\n%s", out)
			}
		})
	}
}

func TestKeyChangesWithThePackages(t *testing.T) {
	k := Key("bookworm")
	if k != Key("bookworm") || !strings.HasPrefix(k, "bookworm-") {
		t.Fatalf("key %q: not stable, or not named by its suite", k)
	}
	if Key("trixie") == k {
		t.Error("another suite has the same key")
	}
	saved := BasePackages
	t.Cleanup(func() { BasePackages = saved })
	BasePackages = append(BasePackages[:len(BasePackages):len(BasePackages)], "cowsay")
	if Key("bookworm") == k {
		t.Error("another package list has the same key")
	}
}

// The cache's layers become the root of every stock sandbox: a cache
// that anyone but root could write into, or under such a directory, is
// refused.
func TestCheckOwnedRefusesAWritableCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the directories it makes are their maker's")
	}
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{open, filepath.Join(open, "cache")} {
		os.MkdirAll(d, 0o700)
		if err := checkOwned(d); err == nil || !strings.Contains(err.Error(), open+" must be root's and writable by root alone") {
			t.Errorf("%s: got %v, want %s refused", d, err, open)
		}
	}
	if err := checkOwned(dir); err != nil {
		t.Errorf("root's own directory: %v", err)
	}
}
