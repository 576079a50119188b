package filesystem

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem/filesystemtest"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

// watchEvent is one message of a WatchDir stream.
type watchEvent struct {
	Start      *struct{} `json:"start"`
	Keepalive  *struct{} `json:"keepalive"`
	Filesystem *struct {
		Name  string                `json:"name"`
		Type  string                `json:"type"`
		Entry *filesystemtest.Entry `json:"entry"`
	} `json:"filesystem"`
}

// watch opens a WatchDir stream of req, its start read.
func watch(t *testing.T, url string, req map[string]any) *rpctest.Stream {
	t.Helper()
	s := rpctest.OpenStream(t, url, "filesystem.Filesystem/WatchDir", req, "")
	var ev watchEvent
	if more, err := s.Next(&ev); !more || ev.Start == nil {
		t.Fatalf("WatchDir %v: %+v, %v; want its start", req, ev, err)
	}
	return s
}

// await reads s until an event of typ for name comes, and returns it.
func await(t *testing.T, s *rpctest.Stream, typ, name string) watchEvent {
	t.Helper()
	for {
		var ev watchEvent
		if more, err := s.Next(&ev); !more {
			t.Fatalf("the stream ended (%v) before %s %s", err, typ, name)
		}
		if f := ev.Filesystem; f != nil && f.Type == typ && f.Name == name {
			return ev
		}
	}
}

func TestWatchDir(t *testing.T) {
	_, url, home := newService(t)
	s := watch(t, url, map[string]any{"path": "~"})
	p := filepath.Join(home, "a")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if ev := await(t, s, "EVENT_TYPE_CREATE", "a"); ev.Filesystem.Entry != nil {
		t.Errorf("an entry, not asked for: %+v", ev.Filesystem.Entry)
	}
	os.WriteFile(p, []byte("x"), 0o644)
	await(t, s, "EVENT_TYPE_WRITE", "a")
	os.Chmod(p, 0o600)
	await(t, s, "EVENT_TYPE_CHMOD", "a")
	os.Rename(p, filepath.Join(home, "b"))
	await(t, s, "EVENT_TYPE_RENAME", "a")
	await(t, s, "EVENT_TYPE_CREATE", "b")
	os.Remove(filepath.Join(home, "b"))
	await(t, s, "EVENT_TYPE_REMOVE", "b")
	// Not recursive: a subdirectory's own changes are not seen, the
	// next change here is.
	os.Mkdir(filepath.Join(home, "sub"), 0o755)
	await(t, s, "EVENT_TYPE_CREATE", "sub")
	os.WriteFile(filepath.Join(home, "sub/x"), nil, 0o644)
	os.WriteFile(filepath.Join(home, "c"), nil, 0o644)
	var ev watchEvent
	for ev.Filesystem == nil {
		s.Next(&ev)
	}
	if ev.Filesystem.Name != "c" {
		t.Errorf("after sub/x and c, the event of %q, want c's: the watch is not recursive", ev.Filesystem.Name)
	}
}

// TestWatchDirRecursive: a directory made under the watched one is
// watched from the event that reports it, with its entry when asked.
func TestWatchDirRecursive(t *testing.T) {
	_, url, home := newService(t)
	os.MkdirAll(filepath.Join(home, "old/deep"), 0o755)
	s := watch(t, url, map[string]any{"path": home, "recursive": true, "includeEntry": true})
	os.WriteFile(filepath.Join(home, "old/deep/f"), nil, 0o644)
	await(t, s, "EVENT_TYPE_CREATE", "old/deep/f")
	os.Mkdir(filepath.Join(home, "new"), 0o755)
	ev := await(t, s, "EVENT_TYPE_CREATE", "new")
	if e := ev.Filesystem.Entry; e == nil || e.Type != "FILE_TYPE_DIRECTORY" || e.Path != filepath.Join(home, "new") {
		t.Errorf("the new directory's entry: %+v", e)
	}
	os.WriteFile(filepath.Join(home, "new/f"), []byte("12"), 0o644)
	if e := await(t, s, "EVENT_TYPE_CREATE", "new/f").Filesystem.Entry; e == nil || e.Name != "f" {
		t.Errorf("the new file's entry: %+v", e)
	}
	os.RemoveAll(filepath.Join(home, "new"))
	if e := await(t, s, "EVENT_TYPE_REMOVE", "new/f").Filesystem.Entry; e != nil {
		t.Errorf("a removed file's event carries an entry: %+v", e)
	}
}

func TestWatchDirRefused(t *testing.T) {
	_, url, home := newService(t)
	os.WriteFile(filepath.Join(home, "f"), nil, 0o644)
	for path, code := range map[string]string{"f": "invalid_argument", "nope": "not_found"} {
		s := rpctest.OpenStream(t, url, "filesystem.Filesystem/WatchDir", map[string]any{"path": path}, "")
		if more, err := s.Next(&watchEvent{}); more || err == nil || err.Code != code {
			t.Errorf("WatchDir %s: %v %v, want %s", path, more, err, code)
		}
	}
}
