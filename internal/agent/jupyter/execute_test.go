package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"
)

// outputs runs code on k and returns what it emitted, by type, and the
// stream's texts. The reply (the shell socket's) comes last here: its
// order against the iopub socket's outputs is no one's to keep.
func outputs(t *testing.T, k *Kernel, code string) (types, texts []string, err error) {
	t.Helper()
	replies := 0
	defer func() {
		for range replies {
			types = append(types, "execute_reply")
		}
	}()
	err = k.Execute(t.Context(), code, func(o Output) {
		if o.Type == "execute_reply" {
			replies++
			return
		}
		types = append(types, o.Type)
		var c struct{ Text string }
		if json.Unmarshal(o.Content, &c) == nil && c.Text != "" {
			texts = append(texts, c.Text)
		}
	})
	return types, texts, err
}

// TestHandshake: a kernel is ready once it answers kernel_info and its
// iopub carries a message for it; one that misses the first request is
// asked again.
func TestHandshake(t *testing.T) {
	k, fk := startFake(t, ok, 0, 1)
	if fk.infoSeen < 2 {
		t.Errorf("kernel_info asked %d times, want again after the first went unanswered", fk.infoSeen)
	}
	if types, _, err := outputs(t, k, "x"); err != nil || len(types) == 0 {
		t.Errorf("after the handshake: %v, %v", types, err)
	}
}

// TestExecute: the outputs of this execution, in the order they came,
// and its reply; it ends when both the reply and the idle status came.
func TestExecute(t *testing.T) {
	k, _ := startFake(t, ok, 0, 0)
	types, texts, err := outputs(t, k, "a")
	if err != nil || !slices.Equal(types, []string{"execute_input", "stream", "execute_result", "execute_reply"}) || !slices.Equal(texts, []string{"ran a"}) {
		t.Errorf("got %v %v, %v", types, texts, err)
	}
	// One after the other, each its own.
	if _, texts, err := outputs(t, k, "b"); err != nil || !slices.Equal(texts, []string{"ran b"}) {
		t.Errorf("the second: %v, %v", texts, err)
	}
}

// TestExecuteIgnoresOthers: messages of other requests, or not signed
// with the key, are not this execution's; idle before the reply still
// waits for the reply.
func TestExecuteIgnoresOthers(t *testing.T) {
	k, _ := startFake(t, func(fk *fakeKernel, req *request) {
		other := Header{MsgID: "someone else's"}
		fk.publish("stream", other, map[string]any{"name": "stdout", "text": "not mine"})
		fk.publish("status", other, map[string]any{"execution_state": "idle"})
		fk.publishSigned("stream", req.msg.Header, map[string]any{"name": "stdout", "text": "forged"}, "00")
		fk.publish("stream", req.msg.Header, map[string]any{"name": "stdout", "text": "mine"})
		fk.publish("comm_open", req.msg.Header, map[string]any{"text": "not an output"})
		fk.status(req, "idle")
		fk.reply(req, "execute_reply", map[string]any{"status": "ok"})
	}, 0, 0)
	types, texts, err := outputs(t, k, "x")
	if err != nil || !slices.Equal(texts, []string{"mine"}) || !slices.Equal(types, []string{"stream", "execute_reply"}) {
		t.Errorf("got %v %v, %v", types, texts, err)
	}
}

// TestExecuteError: the kernel's error is an output, not Execute's.
func TestExecuteError(t *testing.T) {
	k, _ := startFake(t, func(fk *fakeKernel, req *request) {
		fk.publish("error", req.msg.Header, map[string]any{"ename": "E", "evalue": "v", "traceback": []string{"t"}})
		fk.reply(req, "execute_reply", map[string]any{"status": "error", "ename": "E", "evalue": "v"})
		fk.status(req, "idle")
	}, 0, 0)
	if types, _, err := outputs(t, k, "x"); err != nil || !slices.Equal(types, []string{"error", "execute_reply"}) {
		t.Errorf("got %v, %v", types, err)
	}
}

// TestExecuteSilent: silent code leaves no history; its failure is a
// CodeError; an abort (stop_on_error after an earlier error) is retried
// until the code runs.
func TestExecuteSilent(t *testing.T) {
	aborts := 2
	k, fk := startFake(t, func(fk *fakeKernel, req *request) {
		status := map[string]any{"status": "ok"}
		switch {
		case req.code == "fail":
			status = map[string]any{"status": "error", "ename": "NameError", "evalue": "x"}
		case req.code == "aborted" && aborts > 0:
			aborts--
			status = map[string]any{"status": "aborted"}
		}
		fk.reply(req, "execute_reply", status)
		fk.status(req, "idle")
	}, 0, 0)
	if err := k.ExecuteSilent(t.Context(), "fine"); err != nil {
		t.Errorf("fine: %v", err)
	}
	if req := <-fk.requests; !req.silent || req.code != "fine" {
		t.Errorf("the request: %+v, want silent", req)
	}
	var ce *CodeError
	if err := k.ExecuteSilent(t.Context(), "fail"); !errors.As(err, &ce) || ce.Error() != "NameError: x" {
		t.Errorf("fail: %v, want the CodeError", err)
	}
	<-fk.requests
	if err := k.ExecuteSilent(t.Context(), "aborted"); err != nil || aborts != 0 {
		t.Errorf("aborted twice: %v, %d aborts left", err, aborts)
	}
	if n := len(fk.requests); n != 3 {
		t.Errorf("aborted twice: sent %d times, want 3", n)
	}
}

// TestExecuteEnds: an execution ends with the kernel's death or the
// caller's context, whichever comes, without an answer.
func TestExecuteEnds(t *testing.T) {
	k, fk := startFake(t, hang, 0, 0)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-fk.requests; cancel() }()
	if err := k.Execute(ctx, "x", func(Output) {}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if k.WaitIdle(10 * time.Millisecond) {
		t.Error("WaitIdle: a kernel that never answers came back")
	}
	go func() { <-fk.requests; <-fk.requests; close(k.done) }()
	if err := k.Execute(t.Context(), "y", func(Output) {}); !errors.Is(err, ErrKernelDied) {
		t.Errorf("the kernel died: %v", err)
	}
	select {
	case <-k.Done():
	default:
		t.Error("Done is not closed")
	}
}

func TestWaitIdle(t *testing.T) {
	k, fk := startFake(t, ok, 0, 0)
	if !k.WaitIdle(10 * time.Second) {
		t.Error("an idle kernel did not come back")
	}
	if req := <-fk.requests; req.code != "" || !req.silent {
		t.Errorf("WaitIdle sent %+v, want empty silent code", req)
	}
}

// TestLateOutput: for a kernel that publishes out of order, output
// after the idle status still counts, for LateOutput.
func TestLateOutput(t *testing.T) {
	late := func(fk *fakeKernel, req *request) {
		fk.reply(req, "execute_reply", map[string]any{"status": "ok"})
		fk.status(req, "idle")
		fk.publish("execute_result", req.msg.Header, map[string]any{"data": map[string]any{"text/plain": "late"}})
	}
	k, _ := startFake(t, late, time.Second, 0)
	if types, _, err := outputs(t, k, "x"); err != nil || !slices.Equal(types, []string{"execute_result", "execute_reply"}) {
		t.Errorf("got %v, %v; want the late result", types, err)
	}
}
