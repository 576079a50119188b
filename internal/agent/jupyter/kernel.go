// Package jupyter runs Jupyter kernels and speaks the Jupyter messaging
// protocol (5.3) to them over ZeroMQ.
package jupyter

import (
	"context"
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

// newKernel is a kernel of language, not connected yet, with a key and
// a session of its own.
func newKernel(language string, late time.Duration) *Kernel {
	return &Kernel{
		Language: language, key: []byte(newID()), session: newID(), late: late,
		iopubCh: make(chan *Message, 256), shellCh: make(chan *Message, 16), done: make(chan struct{}),
	}
}

// Start launches the kernel of spec and waits until it answers
// (kernel_info_reply, and an iopub message for it).
func Start(ctx context.Context, spec *Spec, opts Options) (*Kernel, error) {
	k := newKernel(spec.Language, opts.LateOutput)
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

// connect connects to the kernel's ports and waits until it answers.
func (k *Kernel) connect(ctx context.Context) error {
	ep := func(i int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", k.ports[i]) }
	return k.dial(ctx, ep(0), ep(1), ep(3))
}

// dial connects to the kernel's shell, iopub and control sockets at the
// endpoints given, and waits until it answers.
func (k *Kernel) dial(ctx context.Context, shell, iopub, control string) error {
	opts := []zmq4.Option{zmq4.WithDialerRetry(10 * time.Millisecond), zmq4.WithDialerMaxRetries(1000)}
	k.iopub = zmq4.NewSub(context.Background(), opts...)
	// Subscribe before dialing, or the first messages are lost.
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return err
	}
	k.shell = zmq4.NewDealer(context.Background(), opts...)
	k.control = zmq4.NewDealer(context.Background(), opts...)
	for _, c := range []struct {
		s  zmq4.Socket
		ep string
	}{{k.iopub, iopub}, {k.shell, shell}, {k.control, control}} {
		if err := c.s.Dial(c.ep); err != nil {
			return fmt.Errorf("connect to kernel: %w", err)
		}
	}
	go k.recvLoop(k.iopub, k.iopubCh)
	go k.recvLoop(k.shell, k.shellCh)
	return k.handshake(ctx)
}

// handshake waits until the kernel answers kernel_info and its iopub
// socket is seen to carry messages for it (so none is missed later),
// asking again every half second.
func (k *Kernel) handshake(ctx context.Context) error {
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
