package filesystem

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

type polledEvents struct {
	Events []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	} `json:"events"`
}

func TestPolledWatcher(t *testing.T) {
	s, url, home := newService(t)
	var created struct {
		WatcherID string `json:"watcherId"`
	}
	rpctest.MustUnary(t, url, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "~"}, &created)
	if created.WatcherID == "" {
		t.Fatal("no watcher id")
	}
	pw, err := s.polled(created.WatcherID)
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]any{"watcherId": created.WatcherID}
	var got polledEvents
	rpctest.MustUnary(t, url, "filesystem.Filesystem/GetWatcherEvents", id, &got)
	if got.Events == nil || len(got.Events) != 0 {
		t.Errorf("before any change: %+v, want an empty list", got)
	}
	os.Mkdir(filepath.Join(home, "d"), 0o755)
	<-pw.added
	rpctest.MustUnary(t, url, "filesystem.Filesystem/GetWatcherEvents", id, &got)
	if len(got.Events) != 1 || got.Events[0].Name != "d" || got.Events[0].Type != "EVENT_TYPE_CREATE" {
		t.Errorf("after a mkdir: %+v, want d's creation", got)
	}
	got = polledEvents{}
	rpctest.MustUnary(t, url, "filesystem.Filesystem/GetWatcherEvents", id, &got)
	if len(got.Events) != 0 {
		t.Errorf("polled again: %+v, want the events gone", got)
	}
	rpctest.MustUnary(t, url, "filesystem.Filesystem/RemoveWatcher", id, nil)
	rpctest.WantError(t, url, "filesystem.Filesystem/GetWatcherEvents", id, "not_found", 404)
	rpctest.WantError(t, url, "filesystem.Filesystem/RemoveWatcher", id, "not_found", 404)
	rpctest.WantError(t, url, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "nope"}, "not_found", 404)
}

// TestPolledWatcherBound: a watcher nobody polls keeps a bounded number
// of events.
func TestPolledWatcherBound(t *testing.T) {
	pw := &polledWatcher{added: make(chan struct{}, 1)}
	for range maxPolledEvents + 5 {
		pw.add(filesystemEvent{Name: "x", Type: eventWrite})
	}
	if len(pw.events) != maxPolledEvents {
		t.Errorf("kept %d events, want %d", len(pw.events), maxPolledEvents)
	}
}
