package process

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

func TestSendInputAndCloseStdin(t *testing.T) {
	_, url, _ := newService(t)
	// cat echoes its input until it ends; the process lives on, so that
	// its stdin can be seen closed.
	s, pid := startProcess(t, url, map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "cat; echo eof; exec sleep 60"}}, "stdin": true}, "")
	sel := map[string]any{"pid": pid}
	rpctest.MustUnary(t, url, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": []byte("to cat\n")}}, nil)
	rpctest.MustUnary(t, url, "process.Process/SendInput", map[string]any{"process": sel}, nil) // no input: nothing to do
	rpctest.MustUnary(t, url, "process.Process/CloseStdin", map[string]any{"process": sel}, nil)
	var got string
	for got != "to cat\neof\n" {
		var ev event
		if more, err := s.Next(&ev); !more {
			t.Fatalf("the stream ended (%v) after %q, want cat's output and eof", err, got)
		}
		if ev.Event.Data != nil {
			got += string(ev.Event.Data.Stdout)
		}
	}
	rpctest.MustUnary(t, url, "process.Process/CloseStdin", map[string]any{"process": sel}, nil) // closed twice: as once
	rpctest.WantError(t, url, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": []byte("late")}}, "failed_precondition", 400)
	rpctest.MustUnary(t, url, "process.Process/SendSignal", map[string]any{"process": sel, "signal": "SIGNAL_SIGKILL"}, nil)
	finish(t, s, pid)
}

func TestSendInputWithoutStdin(t *testing.T) {
	_, url, _ := newService(t)
	s, pid := startProcess(t, url, map[string]any{"process": map[string]any{"cmd": "/bin/sleep", "args": []string{"60"}}, "stdin": false}, "")
	sel := map[string]any{"pid": pid}
	rpctest.WantError(t, url, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": []byte("x")}}, "failed_precondition", 400)
	rpctest.WantError(t, url, "process.Process/SendInput", map[string]any{"process": map[string]any{"pid": pid + 1<<20}, "input": map[string]any{"stdin": []byte("x")}}, "not_found", 404)
	rpctest.MustUnary(t, url, "process.Process/SendSignal", map[string]any{"process": sel, "signal": "SIGNAL_SIGKILL"}, nil)
	finish(t, s, pid)
}

// TestPTYInput: a PTY process takes its input on the pty; stdin input
// and CloseStdin are refused, saying what to do instead.
func TestPTYInput(t *testing.T) {
	_, url, _ := newService(t)
	req := command("/bin/sh", "-c", "read line; echo got $line")
	req["pty"] = map[string]any{}
	s, pid := startProcess(t, url, req, "")
	sel := map[string]any{"pid": pid}
	rpctest.WantError(t, url, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": []byte("x\n")}}, "failed_precondition", 400)
	rpctest.WantError(t, url, "process.Process/CloseStdin", map[string]any{"process": sel}, "failed_precondition", 400)
	rpctest.MustUnary(t, url, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"pty": []byte("typed\n")}}, nil)
	if r := finish(t, s, pid); r.exitCode != 0 || !strings.Contains(r.pty, "got typed") {
		t.Errorf("got %+v, want the line read from the terminal", r)
	}
}

func TestStreamInputIsUnimplemented(t *testing.T) {
	_, url, _ := newService(t)
	rpctest.WantError(t, url, "process.Process/StreamInput", map[string]any{}, "unimplemented", 501)
}
