package process

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

// TestConnect: a second stream attached by tag or pid sees the same
// process end; once it has ended, there is nothing to attach to.
func TestConnect(t *testing.T) {
	_, url, _ := newService(t)
	s, pid := sleeper(t, url, "sleeper")
	streams := map[string]*rpctest.Stream{"Start": s}
	for name, sel := range map[string]map[string]any{"by tag": {"tag": "sleeper"}, "by pid": {"pid": pid}} {
		c := rpctest.OpenStream(t, url, "process.Process/Connect", map[string]any{"process": sel}, "")
		var ev event
		if more, _ := c.Next(&ev); !more || ev.Event.Start == nil || ev.Event.Start.Pid != pid {
			t.Fatalf("Connect %s: %+v, want the sleeper's start", name, ev.Event)
		}
		streams[name] = c
	}
	rpctest.MustUnary(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": pid}, "signal": "SIGNAL_SIGKILL"}, nil)
	for name, stream := range streams {
		r := finish(t, stream, pid)
		if r.exited || !strings.Contains(r.status, "killed") || r.endErr == nil {
			t.Errorf("%s stream after SIGKILL: %+v, want killed by a signal", name, r)
		}
	}
	gone := rpctest.OpenStream(t, url, "process.Process/Connect", map[string]any{"process": map[string]any{"tag": "sleeper"}}, "")
	if more, err := gone.Next(&event{}); more || err == nil || err.Code != "not_found" {
		t.Errorf("Connect after the end: more %v, err %v; want not_found", more, err)
	}
}

func TestConnectToNothing(t *testing.T) {
	_, url, _ := newService(t)
	for _, sel := range []map[string]any{{"pid": 1 << 30}, {"tag": "none"}, {}} {
		s := rpctest.OpenStream(t, url, "process.Process/Connect", map[string]any{"process": sel}, "")
		if more, err := s.Next(&event{}); more || err == nil || (err.Code != "not_found" && err.Code != "invalid_argument") {
			t.Errorf("Connect to %v: more %v, err %v; want not_found or invalid_argument", sel, more, err)
		}
	}
}

// TestConnectDetached: a stream that went away no longer holds the
// process's output back; the others still get all of it.
func TestConnectDetached(t *testing.T) {
	_, url, _ := newService(t)
	req := command("/bin/sh", "-c", "read x; head -c 300000 /dev/zero | tr '\\0' y")
	s, pid := startProcess(t, url, req, "")
	c := rpctest.OpenStream(t, url, "process.Process/Connect", map[string]any{"process": map[string]any{"pid": pid}}, "")
	c.Close() // attached, then gone without reading a byte
	rpctest.MustUnary(t, url, "process.Process/SendInput", map[string]any{"process": map[string]any{"pid": pid}, "input": map[string]any{"stdin": []byte("go\n")}}, nil)
	if r := finish(t, s, pid); len(r.stdout) != 300000 || r.exitCode != 0 {
		t.Errorf("got %d bytes, exit %d; want 300000 and 0", len(r.stdout), r.exitCode)
	}
}
