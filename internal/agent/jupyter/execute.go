package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Output is one thing an execution produced, in the order it came.
type Output struct {
	Type    string          // "stream", "execute_result", "display_data", "error", "execute_input", "execute_reply"
	Content json.RawMessage // the message's content
}

// ErrKernelDied is returned when the kernel process exits mid-execution.
var ErrKernelDied = errors.New("the kernel died")

// Execute runs code and calls emit for each output as it arrives. It
// returns when the kernel is idle again (the execute_reply and the iopub
// "idle" status for this request both arrived), when the kernel dies, or
// when ctx ends (the caller then interrupts or restarts the kernel).
func (k *Kernel) Execute(ctx context.Context, code string, emit func(Output)) error {
	return k.execute(ctx, code, false, emit)
}

// CodeError is code that ran and failed.
type CodeError struct{ Name, Value string }

func (e *CodeError) Error() string { return e.Name + ": " + e.Value }

// ExecuteSilent runs code without output or history (setting up an
// execution's environment, say). A kernel still aborting what arrives
// after an earlier cell's error (stop_on_error) answers "aborted": the
// code is sent again, every 20 ms, until it runs or ctx ends. Code that
// fails is an error.
func (k *Kernel) ExecuteSilent(ctx context.Context, code string) error {
	for {
		var rep struct {
			Status string `json:"status"`
			Ename  string `json:"ename"`
			Evalue string `json:"evalue"`
		}
		err := k.execute(ctx, code, true, func(o Output) {
			if o.Type == "execute_reply" {
				json.Unmarshal(o.Content, &rep)
			}
		})
		switch {
		case err != nil:
			return err
		case rep.Status == "error":
			return &CodeError{Name: rep.Ename, Value: rep.Evalue}
		case rep.Status != "aborted" && rep.Status != "abort":
			return nil
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (k *Kernel) execute(ctx context.Context, code string, silent bool, emit func(Output)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	// Drop what earlier executions left unread.
	for drained := false; !drained; {
		select {
		case <-k.iopubCh:
		case <-k.shellCh:
		default:
			drained = true
		}
	}
	// stop_on_error false: cells go one at a time, so there is no queue
	// to stop, and ipykernel aborts whatever reaches it just after an
	// error's reply: a cell sent at once after a failed one (as agents
	// do) would come back "aborted" without having run.
	id, err := k.send(k.shell, "execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent,
		"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return err
	}
	replied, idle := false, false
	for !(replied && idle) {
		select {
		case m := <-k.shellCh:
			if m.Parent.MsgID == id && m.Header.MsgType == "execute_reply" {
				replied = true
				emit(Output{Type: "execute_reply", Content: m.Content})
			}
		case m := <-k.iopubCh:
			if m.Parent.MsgID != id {
				continue
			}
			switch m.Header.MsgType {
			case "status":
				var st struct {
					State string `json:"execution_state"`
				}
				json.Unmarshal(m.Content, &st)
				idle = st.State == "idle"
			case "stream", "execute_result", "display_data", "error", "execute_input":
				emit(Output{Type: m.Header.MsgType, Content: m.Content})
			}
		case <-k.done:
			return ErrKernelDied
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if k.late > 0 {
		late := time.After(k.late)
		for {
			select {
			case m := <-k.iopubCh:
				switch m.Header.MsgType {
				case "stream", "execute_result", "display_data", "error":
					if m.Parent.MsgID == id {
						emit(Output{Type: m.Header.MsgType, Content: m.Content})
					}
				}
			case <-late:
				return nil
			}
		}
	}
	return nil
}

// WaitIdle waits until the kernel answers again after an interrupt, up to
// d; it reports whether it did.
//
// An empty execution answered means the kernel is back. One answered
// "aborted" does not: after the interrupted cell's error the kernel
// (stop_on_error) aborts what arrives for a moment, and the next real
// cell would be aborted too. So it asks again until one runs.
func (k *Kernel) WaitIdle(d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return k.ExecuteSilent(ctx, "") == nil
}
