package process

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

// TestUpdate: a PTY's new size is what the process reads next.
func TestUpdate(t *testing.T) {
	_, url, _ := newService(t)
	req := command("/bin/sh", "-c", "read x; stty size")
	req["pty"] = map[string]any{"size": map[string]any{"cols": 80, "rows": 24}}
	s, pid := startProcess(t, url, req, "")
	sel := map[string]any{"pid": pid}
	rpctest.MustUnary(t, url, "process.Process/Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 132, "rows": 50}}}, nil)
	rpctest.MustUnary(t, url, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"pty": []byte("\n")}}, nil)
	if r := finish(t, s, pid); !strings.Contains(r.pty, "50 132") {
		t.Errorf("pty output %q, want the new size 50 132", r.pty)
	}
}

func TestUpdateRefused(t *testing.T) {
	_, url, _ := newService(t)
	_, pid := sleeper(t, url, "")
	size := map[string]any{"size": map[string]any{"cols": 1, "rows": 1}}
	rpctest.WantError(t, url, "process.Process/Update", map[string]any{"process": map[string]any{"pid": pid}, "pty": size}, "failed_precondition", 400)
	rpctest.WantError(t, url, "process.Process/Update", map[string]any{"process": map[string]any{"tag": "none"}, "pty": size}, "not_found", 404)
	rpctest.MustUnary(t, url, "process.Process/Update", map[string]any{"process": map[string]any{"pid": pid}}, nil) // nothing to update
}
