package filesystem

import (
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

func TestUploadMetadata(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.Header
		want map[string]string
		err  string
	}{
		{"none", http.Header{"Content-Type": {"x"}}, nil, ""},
		{"keys lowercased, first values", http.Header{"X-Metadata-Author": {"ada", "bob"}, "X-Metadata-Build-Id": {"42"}},
			map[string]string{"author": "ada", "build-id": "42"}, ""},
		{"the prefix alone", http.Header{"X-Metadata-": {"x"}}, nil, ""},
		{"not ASCII", http.Header{"X-Metadata-A": {"\u00e9"}}, nil, "printable US-ASCII"},
		{"a control character", http.Header{"X-Metadata-A": {"a\tb"}}, nil, "printable US-ASCII"},
		{"a key too long", http.Header{"X-Metadata-" + strings.Repeat("k", maxMetadataKey+1): {"v"}}, nil, "longer than"},
		{"the longest key", http.Header{"X-Metadata-" + strings.Repeat("k", maxMetadataKey): {"v"}},
			map[string]string{strings.Repeat("k", maxMetadataKey): "v"}, ""},
		{"a set too large", http.Header{"X-Metadata-A": {strings.Repeat("v", 2100)}, "X-Metadata-B": {strings.Repeat("v", 2100)}}, nil, "larger than 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, e := UploadMetadata(tc.h)
			if tc.err != "" {
				if e == nil || e.Code != agentproto.CodeInvalidArgument || !strings.Contains(e.Message, tc.err) {
					t.Errorf("got %v, %v; want invalid_argument with %q", got, e, tc.err)
				}
				return
			}
			if e != nil || !maps.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Errorf("got %v, %v; want %v", got, e, tc.want)
			}
		})
	}
}

// xattrFile is a new file in a file system with user xattrs, or the test
// is skipped.
func xattrFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.probe", []byte("x"), 0); errors.Is(err, unix.ENOTSUP) {
		t.Skip("the temporary directory's file system has no user xattrs")
	} else if err != nil {
		t.Fatal(err)
	}
	unix.Removexattr(p, "user.probe")
	return p
}

// TestMetadata: a file's set is replaced whole, read back through links,
// and only its own keys (user.e2b.*, UTF-8) are reported.
func TestMetadata(t *testing.T) {
	p := xattrFile(t)
	set := func(md map[string]string) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := SetMetadata(f, md); err != nil {
			t.Fatal(err)
		}
	}
	if md := Metadata(p); md != nil {
		t.Errorf("a new file: %v, want none", md)
	}
	set(map[string]string{"a": "1", "b": "2"})
	if md := Metadata(p); !maps.Equal(md, map[string]string{"a": "1", "b": "2"}) {
		t.Errorf("after a set: %v", md)
	}
	// Set by sandbox code: another namespace's, and bytes that are no
	// string.
	unix.Setxattr(p, "user.other", []byte("kept"), 0)
	unix.Setxattr(p, "user.e2b.bin", []byte{0xff, 0xfe}, 0)
	set(map[string]string{"b": "3"})
	if md := Metadata(p); !maps.Equal(md, map[string]string{"b": "3"}) {
		t.Errorf("after a second set: %v, want only b=3", md)
	}
	v := make([]byte, 8)
	if n, err := unix.Getxattr(p, "user.other", v); err != nil || string(v[:n]) != "kept" {
		t.Errorf("another namespace's xattr: %q, %v; want it kept", v[:max(n, 0)], err)
	}
	link := p + ".link"
	os.Symlink(p, link)
	if md := Metadata(link); !maps.Equal(md, map[string]string{"b": "3"}) {
		t.Errorf("through a link: %v", md)
	}
	set(nil)
	if md := Metadata(p); md != nil {
		t.Errorf("after clearing: %v", md)
	}
	if md := Metadata(p + ".missing"); md != nil {
		t.Errorf("a missing file: %v", md)
	}
}
