package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// fakeKernel serves the Jupyter protocol in-process, over ZeroMQ's
// inproc transport: a kernel whose every answer the test chooses. It
// verifies the signature of every request it gets, with the key it
// shares with its Kernel.
type fakeKernel struct {
	errorf                func(format string, args ...any)
	signer                *Kernel // holds the shared key
	shell, control, iopub zmq4.Socket
	// run answers one execute_request; it runs on the kernel's one
	// goroutine, as a kernel runs one cell at a time.
	run func(fk *fakeKernel, req *request)
	// infoSeen counts kernel_info_requests; skipInfo of them go
	// unanswered first.
	infoSeen, skipInfo int
	requests           chan *request // every execute_request, as it comes
}

// request is one request the fake kernel got.
type request struct {
	identity []byte
	msg      *Message
	code     string
	silent   bool
}

var fakes atomic.Int64

// startFake serves a fake kernel whose cells run runs, and returns a
// Kernel connected to it (late is its LateOutput).
func startFake(t *testing.T, run func(*fakeKernel, *request), late time.Duration, skipInfo int) (*Kernel, *fakeKernel) {
	t.Helper()
	k := newKernel("fake", late)
	fk := &fakeKernel{errorf: t.Errorf, signer: &Kernel{key: k.key}, run: run, skipInfo: skipInfo, requests: make(chan *request, 64)}
	ep := fmt.Sprintf("inproc://fake-kernel-%d-", fakes.Add(1))
	if err := fk.listen(ep+"shell", ep+"iopub", ep+"control"); err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); fk.serve() }()
	t.Cleanup(func() {
		k.Kill()
		for _, s := range []zmq4.Socket{fk.shell, fk.control, fk.iopub} {
			s.Close()
		}
		<-served
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := k.dial(ctx, ep+"shell", ep+"iopub", ep+"control"); err != nil {
		t.Fatalf("connect to the fake kernel: %v", err)
	}
	return k, fk
}

// listen binds the kernel's sockets at the endpoints given.
func (fk *fakeKernel) listen(shell, iopub, control string) error {
	ctx := context.Background()
	fk.shell, fk.control, fk.iopub = zmq4.NewRouter(ctx), zmq4.NewRouter(ctx), zmq4.NewPub(ctx)
	for _, s := range []struct {
		s  zmq4.Socket
		ep string
	}{{fk.shell, shell}, {fk.iopub, iopub}, {fk.control, control}} {
		if err := s.s.Listen(s.ep); err != nil {
			return err
		}
	}
	return nil
}

// serve answers the shell socket's requests until it is closed.
func (fk *fakeKernel) serve() {
	for {
		raw, err := fk.shell.Recv()
		if err != nil {
			return
		}
		m, err := fk.signer.decode(raw.Frames)
		if err != nil {
			fk.errorf("the kernel got a request it cannot verify: %v", err)
			continue
		}
		req := &request{identity: raw.Frames[0], msg: m}
		switch m.Header.MsgType {
		case "kernel_info_request":
			if fk.infoSeen++; fk.infoSeen <= fk.skipInfo {
				continue // as if the iopub subscription were not through yet
			}
			fk.status(req, "busy")
			fk.reply(req, "kernel_info_reply", map[string]any{"status": "ok", "protocol_version": "5.3"})
			fk.status(req, "idle")
		case "execute_request":
			var c struct {
				Code   string `json:"code"`
				Silent bool   `json:"silent"`
			}
			json.Unmarshal(m.Content, &c)
			req.code, req.silent = c.Code, c.Silent
			fk.requests <- req
			fk.run(fk, req)
		}
	}
}

// frames is a message of msgType, child of parent, signed with sig (the
// right signature if "").
func (fk *fakeKernel) frames(msgType string, parent Header, content any, sig string) [][]byte {
	hdr, _ := json.Marshal(Header{MsgID: newID(), Session: "fake", MsgType: msgType, Version: "5.3"})
	par, _ := json.Marshal(parent)
	body, _ := json.Marshal(content)
	meta := []byte("{}")
	if sig == "" {
		sig = fk.signer.sign(hdr, par, meta, body)
	}
	return [][]byte{[]byte(delimiter), []byte(sig), hdr, par, meta, body}
}

// publish sends a message on iopub, child of parent.
func (fk *fakeKernel) publish(msgType string, parent Header, content any) {
	fk.publishSigned(msgType, parent, content, "")
}

func (fk *fakeKernel) publishSigned(msgType string, parent Header, content any, sig string) {
	if err := fk.iopub.Send(zmq4.NewMsgFrom(fk.frames(msgType, parent, content, sig)...)); err != nil {
		fk.errorf("publish %s: %v", msgType, err)
	}
}

// reply answers req on the shell socket.
func (fk *fakeKernel) reply(req *request, msgType string, content any) {
	frames := append([][]byte{req.identity}, fk.frames(msgType, req.msg.Header, content, "")...)
	if err := fk.shell.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		fk.errorf("reply %s: %v", msgType, err)
	}
}

func (fk *fakeKernel) status(req *request, state string) {
	fk.publish("status", req.msg.Header, map[string]any{"execution_state": state})
}

// ok runs a cell as IPython does: busy, its input, a line of output and
// its value, the reply, idle.
func ok(fk *fakeKernel, req *request) {
	fk.status(req, "busy")
	if !req.silent {
		fk.publish("execute_input", req.msg.Header, map[string]any{"code": req.code, "execution_count": 1})
		fk.publish("stream", req.msg.Header, map[string]any{"name": "stdout", "text": "ran " + req.code})
		fk.publish("execute_result", req.msg.Header, map[string]any{"data": map[string]any{"text/plain": "42"}})
	}
	fk.reply(req, "execute_reply", map[string]any{"status": "ok"})
	fk.status(req, "idle")
}

// hang never answers.
func hang(*fakeKernel, *request) {}

// TestMain runs the test binary as a fake kernel process where Start
// starts it (AIRLOCK_FAKE_KERNEL names where it reports what it was
// given), as a test otherwise.
func TestMain(m *testing.M) {
	if out := os.Getenv("AIRLOCK_FAKE_KERNEL"); out != "" {
		os.Exit(fakeKernelMain(out, os.Args[1], os.Args[2]))
	}
	os.Exit(m.Run())
}

// fakeKernelMain is a kernel process: it writes what it was started with
// into out (its connection file, the file beside it, its argument, its
// environment and directory), then serves its connection file's ports
// with ok until it is killed.
func fakeKernelMain(out, connFile, arg string) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "fake kernel:", err); return 2 }
	data, err := os.ReadFile(connFile)
	if err != nil {
		return fail(err)
	}
	extra, _ := os.ReadFile(filepath.Join(filepath.Dir(connFile), "extra.txt"))
	wd, _ := os.Getwd()
	for name, content := range map[string]string{
		"conn.json": string(data), "extra.txt": string(extra), "arg": arg, "pwd": wd,
		"env": os.Getenv("FROM_SPEC") + " " + os.Getenv("FROM_OPTS"),
	} {
		if err := os.WriteFile(filepath.Join(out, name), []byte(content), 0o644); err != nil {
			return fail(err)
		}
	}
	var conn struct {
		Key                         string
		Shell, IOPub, Control, Beat int
	}
	var raw map[string]any
	json.Unmarshal(data, &raw)
	conn.Key, _ = raw["key"].(string)
	port := func(k string) string { return fmt.Sprintf("tcp://127.0.0.1:%v", raw[k]) }
	fk := &fakeKernel{errorf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }, signer: &Kernel{key: []byte(conn.Key)},
		run: ok, requests: make(chan *request, 1<<16)}
	if err := fk.listen(port("shell_port"), port("iopub_port"), port("control_port")); err != nil {
		return fail(err)
	}
	fk.serve()
	return 0
}
