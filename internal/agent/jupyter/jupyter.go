// Package jupyter runs Jupyter kernels and speaks the Jupyter messaging
// protocol (5.3) to them over ZeroMQ.
package jupyter

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/airlock-sandbox/airlock/internal/agent/tasks"
)

// Spec is a kernelspec (kernel.json).
type Spec struct {
	Argv        []string          `json:"argv"`
	DisplayName string            `json:"display_name"`
	Language    string            `json:"language"`
	Env         map[string]string `json:"env"`
}

// KernelDirs are where kernelspecs are looked for, as Jupyter does.
var KernelDirs = []string{"/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels"}

// FindSpec returns the first installed kernelspec of names: a kernel
// directory of that name, or else a spec declaring it as its language.
func FindSpec(names ...string) (*Spec, error) {
	specs := map[string]*Spec{}     // by directory
	languages := map[string]*Spec{} // by declared language, first found
	for _, dir := range KernelDirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(dir, e.Name(), "kernel.json"))
			if err != nil {
				continue
			}
			var s Spec
			if json.Unmarshal(data, &s) != nil || len(s.Argv) == 0 {
				continue
			}
			name := strings.ToLower(e.Name())
			if specs[name] == nil {
				specs[name] = &s
			}
			if l := strings.ToLower(s.Language); languages[l] == nil {
				languages[l] = &s
			}
		}
	}
	for _, n := range names {
		if s := specs[strings.ToLower(n)]; s != nil {
			return s, nil
		}
	}
	for _, n := range names {
		if s := languages[strings.ToLower(n)]; s != nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no Jupyter kernel for %s is installed", names[0])
}

// Message is one Jupyter message.
type Message struct {
	Header   Header          `json:"header"`
	Parent   Header          `json:"parent_header"`
	Metadata json.RawMessage `json:"metadata"`
	Content  json.RawMessage `json:"content"`
}

// Header is a message header.
type Header struct {
	MsgID    string `json:"msg_id,omitempty"`
	Session  string `json:"session,omitempty"`
	Username string `json:"username,omitempty"`
	Date     string `json:"date,omitempty"`
	MsgType  string `json:"msg_type,omitempty"`
	Version  string `json:"version,omitempty"`
}

const delimiter = "<IDS|MSG>"

// Kernel is one running kernel and the sockets to it.
type Kernel struct {
	Language string
	cmd      *exec.Cmd
	key      []byte
	session  string
	dir      string        // holds the connection file
	ports    []int         // shell, iopub, stdin, control, heartbeat
	late     time.Duration // Options.LateOutput

	shell, control, iopub zmq4.Socket
	iopubCh               chan *Message
	shellCh               chan *Message
	done                  chan struct{} // closed when the kernel process exits

	mu sync.Mutex // one execution at a time
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Options are how a kernel starts beyond its kernelspec.
type Options struct {
	Cwd  string
	Env  []string
	Cred *syscall.Credential // nil: as this process
	// Args are added to the kernelspec's argv, and Files written first
	// into the kernel's own directory, which "{dir}" in Args names.
	Args  []string
	Files map[string][]byte
	// LateOutput is how long an execution still takes output after the
	// kernel said it was idle, for kernels that publish out of order
	// (Deno's sends a cell's result after its idle status now and then).
	LateOutput time.Duration
}

// Start launches the kernel of spec and waits until it answers
// (kernel_info_reply, and an iopub message for it).
func Start(ctx context.Context, spec *Spec, opts Options) (*Kernel, error) {
	k := &Kernel{
		Language: spec.Language, key: []byte(newID()), session: newID(), late: opts.LateOutput,
		iopubCh: make(chan *Message, 256), shellCh: make(chan *Message, 16), done: make(chan struct{}),
	}
	var err error
	if k.dir, err = os.MkdirTemp("", "airlock-kernel-"); err != nil {
		return nil, err
	}
	// Loopback TCP, as every kernel supports (Deno's has no "ipc"
	// transport), in the sandbox's own network namespace: the ports are
	// picked free here, and the rare one taken before the kernel binds it
	// fails this start, which the caller retries.
	ports, err := freePorts(5)
	if err != nil {
		k.cleanup()
		return nil, err
	}
	k.ports = ports
	conn := map[string]any{
		"ip": "127.0.0.1", "transport": "tcp", "signature_scheme": "hmac-sha256", "key": string(k.key),
		"shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2], "control_port": ports[3], "hb_port": ports[4],
		"kernel_name": spec.Language,
	}
	connFile := filepath.Join(k.dir, "kernel.json")
	data, _ := json.Marshal(conn)
	files := map[string][]byte{"kernel.json": data}
	for name, content := range opts.Files {
		files[name] = content
	}
	for name, content := range files {
		p := filepath.Join(k.dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			k.cleanup()
			return nil, err
		}
		if opts.Cred != nil {
			if err := os.Chown(p, int(opts.Cred.Uid), int(opts.Cred.Gid)); err != nil {
				k.cleanup()
				return nil, err
			}
		}
	}
	// The kernel reads its files in its own directory.
	if opts.Cred != nil {
		if err := os.Chown(k.dir, int(opts.Cred.Uid), int(opts.Cred.Gid)); err != nil {
			k.cleanup()
			return nil, err
		}
	}
	var argv []string
	for _, a := range append(slices.Clone(spec.Argv), opts.Args...) {
		argv = append(argv, strings.NewReplacer("{connection_file}", connFile, "{dir}", k.dir).Replace(a))
	}
	k.cmd = exec.Command(argv[0], argv[1:]...)
	k.cmd.Dir = opts.Cwd
	k.cmd.Env = opts.Env
	for key, v := range spec.Env {
		k.cmd.Env = append(k.cmd.Env, key+"="+v)
	}
	// Its own process group: an interrupt (SIGINT) reaches the kernel and
	// what it runs, nothing else.
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: opts.Cred}
	if err := tasks.Start(k.cmd); err != nil {
		k.cleanup()
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	go func() { k.cmd.Wait(); close(k.done) }()
	if err := k.connect(ctx); err != nil {
		k.Kill()
		return nil, err
	}
	return k, nil
}

// freePorts returns n loopback TCP ports free now.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kernel ports: %w", err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (k *Kernel) connect(ctx context.Context) error {
	ep := func(i int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", k.ports[i-1]) }
	opts := []zmq4.Option{zmq4.WithDialerRetry(10 * time.Millisecond), zmq4.WithDialerMaxRetries(1000)}
	k.iopub = zmq4.NewSub(context.Background(), opts...)
	// Subscribe before dialing, or the first messages are lost.
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return err
	}
	k.shell = zmq4.NewDealer(context.Background(), opts...)
	k.control = zmq4.NewDealer(context.Background(), opts...)
	for _, c := range []struct {
		s zmq4.Socket
		p int
	}{{k.iopub, 2}, {k.shell, 1}, {k.control, 4}} {
		if err := c.s.Dial(ep(c.p)); err != nil {
			return fmt.Errorf("connect to kernel: %w", err)
		}
	}
	go k.recvLoop(k.iopub, k.iopubCh)
	go k.recvLoop(k.shell, k.shellCh)
	// The kernel is ready when it answers kernel_info and its iopub
	// socket is seen to carry messages for it (so none is missed later).
	deadline := time.After(30 * time.Second)
	for {
		id, err := k.send(k.shell, "kernel_info_request", map[string]any{})
		if err != nil {
			return err
		}
		gotReply, gotIOPub := false, false
		retry := time.After(500 * time.Millisecond)
	wait:
		for !(gotReply && gotIOPub) {
			select {
			case m := <-k.shellCh:
				gotReply = gotReply || m.Parent.MsgID == id
			case m := <-k.iopubCh:
				gotIOPub = gotIOPub || m.Parent.MsgID == id
			case <-retry:
				break wait
			case <-k.done:
				return errors.New("the kernel exited while starting")
			case <-deadline:
				return errors.New("the kernel did not answer within 30s")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if gotReply && gotIOPub {
			return nil
		}
	}
}

// recvLoop feeds one socket's messages to ch (Recv blocks without a
// timeout, so it gets a goroutine of its own).
func (k *Kernel) recvLoop(s zmq4.Socket, ch chan *Message) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return
		}
		m, err := k.decode(raw.Frames)
		if err != nil {
			continue
		}
		select {
		case ch <- m:
		case <-k.done:
			return
		}
	}
}

func (k *Kernel) sign(parts ...[]byte) string {
	mac := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		mac.Write(p)
	}
	return hex.EncodeToString(mac.Sum(nil))
}

func (k *Kernel) decode(frames [][]byte) (*Message, error) {
	i := 0
	for i < len(frames) && string(frames[i]) != delimiter {
		i++
	}
	if len(frames) < i+6 {
		return nil, errors.New("short message")
	}
	f := frames[i+1:]
	if !hmac.Equal([]byte(k.sign(f[1], f[2], f[3], f[4])), f[0]) {
		return nil, errors.New("bad signature")
	}
	m := &Message{Metadata: f[3], Content: f[4]}
	if err := json.Unmarshal(f[1], &m.Header); err != nil {
		return nil, err
	}
	_ = json.Unmarshal(f[2], &m.Parent)
	return m, nil
}

// send sends a request on s and returns its msg_id.
func (k *Kernel) send(s zmq4.Socket, msgType string, content any) (string, error) {
	h := Header{
		MsgID: newID(), Session: k.session, Username: "user", MsgType: msgType, Version: "5.3",
		Date: time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
	}
	hdr, _ := json.Marshal(h)
	body, err := json.Marshal(content)
	if err != nil {
		return "", err
	}
	parent, meta := []byte("{}"), []byte("{}")
	msg := zmq4.NewMsgFrom([]byte(delimiter), []byte(k.sign(hdr, parent, meta, body)), hdr, parent, meta, body)
	if err := s.Send(msg); err != nil {
		return "", fmt.Errorf("send to kernel: %w", err)
	}
	return h.MsgID, nil
}

// Done is closed when the kernel process has exited.
func (k *Kernel) Done() <-chan struct{} { return k.done }

// Interrupt sends SIGINT to the kernel's process group.
func (k *Kernel) Interrupt() {
	syscall.Kill(-k.cmd.Process.Pid, syscall.SIGINT)
}

// Kill ends the kernel and everything it started, and removes its files.
func (k *Kernel) Kill() {
	if k.cmd != nil && k.cmd.Process != nil {
		syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.done
	}
	for _, s := range []zmq4.Socket{k.shell, k.control, k.iopub} {
		if s != nil {
			s.Close()
		}
	}
	k.cleanup()
}

func (k *Kernel) cleanup() {
	if k.dir != "" {
		os.RemoveAll(k.dir)
	}
}

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
	id, err := k.send(k.shell, "execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent,
		"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": true,
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
