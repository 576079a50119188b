package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agent/tasks"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Output is read and sent in chunks of at most this size, as envd does.
const chunkSize = 32 << 10

// outputGrace is how long a process's output is still read after it
// exited: a background child that inherited stdout ("sleep 100 &") would
// otherwise hold the command open until the child ends.
const outputGrace = 100 * time.Millisecond

// processTable holds the processes the agent started, by pid.
type processTable struct {
	a  *Agent
	mu sync.Mutex
	m  map[uint32]*process
}

// process is one command started through Start, with its output fanned
// out to every stream currently attached to it.
type process struct {
	info processInfo
	cmd  *exec.Cmd
	pty  *os.File // the master side, for PTY processes

	stdinMu sync.Mutex
	stdin   io.WriteCloser // nil when closed or never opened

	mu   sync.Mutex
	subs map[chan *agentproto.ProcessEvent]struct{}
	done chan struct{} // closed after the end event was delivered
}

func (t *processTable) find(sel *processSelector) (*process, error) {
	if sel == nil || (sel.Pid == nil && sel.Tag == nil) {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "no process selected")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for pid, p := range t.m {
		if (sel.Pid != nil && *sel.Pid == pid) || (sel.Tag != nil && p.info.Tag != nil && *sel.Tag == *p.info.Tag) {
			return p, nil
		}
	}
	if sel.Pid != nil {
		return nil, rpc.Errorf(agentproto.CodeNotFound, "process with pid %d not found", *sel.Pid)
	}
	return nil, rpc.Errorf(agentproto.CodeNotFound, "process with tag %q not found", *sel.Tag)
}

// subscribe attaches a new stream to p's events. The channel is closed
// after the end event, or never if unsubscribe comes first. It fails once
// p has ended.
func (p *process) subscribe() (chan *agentproto.ProcessEvent, error) {
	ch := make(chan *agentproto.ProcessEvent, 64)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs == nil {
		return nil, rpc.Errorf(agentproto.CodeNotFound, "process %d has ended", p.info.Pid)
	}
	p.subs[ch] = struct{}{}
	return ch, nil
}

func (p *process) unsubscribe(ch chan *agentproto.ProcessEvent) {
	p.mu.Lock()
	delete(p.subs, ch)
	p.mu.Unlock()
}

// publish delivers ev to every attached stream. A stream that does not
// keep up slows the process's output down (back-pressure, as in envd)
// but never loses events; a detached stream is skipped.
func (p *process) publish(ev *agentproto.ProcessEvent) {
	p.mu.Lock()
	subs := make([]chan *agentproto.ProcessEvent, 0, len(p.subs))
	for ch := range p.subs {
		subs = append(subs, ch)
	}
	p.mu.Unlock()
	for _, ch := range subs {
		for {
			p.mu.Lock()
			_, attached := p.subs[ch]
			p.mu.Unlock()
			if !attached {
				break
			}
			select {
			case ch <- ev:
			case <-time.After(100 * time.Millisecond):
				continue // re-check that the stream is still attached
			}
			break
		}
	}
}

// start launches cfg as id and registers it.
func (t *processTable) start(req *agentproto.StartRequest, deadline time.Duration, id identity.ID) (*process, chan *agentproto.ProcessEvent, error) {
	cfg := req.Process
	if cfg == nil || cfg.Cmd == "" {
		return nil, nil, rpc.Errorf(agentproto.CodeInvalidArgument, "no command")
	}
	cwd := id.Home
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		cwd = id.Resolve(*cfg.Cwd)
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, nil, rpc.Errorf(agentproto.CodeInvalidArgument, "cwd '%s' does not exist", cwd)
	}
	cmd := exec.Command(cfg.Cmd, cfg.Args...)
	cmd.Dir = cwd
	cmd.Env = t.a.env.ForID(id, cfg.Envs)
	p := &process{
		info: processInfo{Config: cfg, Tag: req.Tag},
		cmd:  cmd,
		subs: map[chan *agentproto.ProcessEvent]struct{}{},
		done: make(chan struct{}),
	}
	var outputs []*os.File // parent ends, read until EOF
	var childEnds []*os.File
	defer func() { closeFiles(childEnds) }()
	if req.Pty != nil {
		master, slave, err := openPTY(req.Pty.Size)
		if err != nil {
			return nil, nil, rpc.Errorf(agentproto.CodeInternal, "open pty: %v", err)
		}
		childEnds = append(childEnds, slave)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// Its own session with the PTY as controlling terminal, as a login
		// shell expects.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		p.pty = master
		outputs = append(outputs, master)
	} else {
		for _, set := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
			r, w, err := os.Pipe()
			if err != nil {
				closeFiles(outputs)
				return nil, nil, rpc.Errorf(agentproto.CodeInternal, "pipe: %v", err)
			}
			*set = w
			childEnds = append(childEnds, w)
			outputs = append(outputs, r)
		}
		// stdin is open unless the client said otherwise (older SDKs never say).
		if req.Stdin == nil || *req.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				closeFiles(outputs)
				return nil, nil, rpc.Errorf(agentproto.CodeInternal, "pipe: %v", err)
			}
			cmd.Stdin = r
			childEnds = append(childEnds, r)
			p.stdin = w
		}
		// Its own process group, so that a signal reaches what it started.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	cmd.SysProcAttr.Credential = t.a.users.Credential(id)
	sub, _ := p.subscribe() // cannot fail: p has not started
	if err := tasks.Start(cmd); err != nil {
		closeFiles(outputs)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, nil, rpc.Errorf(agentproto.CodeInvalidArgument, "start %s: %v", cfg.Cmd, errors.Unwrap(err))
	}
	p.info.Pid = uint32(cmd.Process.Pid)
	t.mu.Lock()
	t.m[p.info.Pid] = p
	t.mu.Unlock()
	var kill *time.Timer
	if deadline > 0 {
		// The SDK's timeoutMs: the command is killed when it passes.
		kill = time.AfterFunc(deadline, func() { p.signal(unix.SIGKILL) })
	}
	go t.run(p, outputs, kill)
	return p, sub, nil
}

// run streams p's output, waits for it to end and publishes its end.
func (t *processTable) run(p *process, outputs []*os.File, kill *time.Timer) {
	var readers sync.WaitGroup
	for i, f := range outputs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]byte, chunkSize)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					chunk := append([]byte(nil), buf[:n]...)
					ev := &agentproto.DataEvent{}
					switch {
					case p.pty != nil:
						ev.Pty = chunk
					case i == 0:
						ev.Stdout = chunk
					default:
						ev.Stderr = chunk
					}
					p.publish(&agentproto.ProcessEvent{Data: ev})
				}
				if err != nil {
					return
				}
			}
		}()
	}
	state, waitErr := p.cmd.Process.Wait()
	if kill != nil {
		kill.Stop()
	}
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(outputGrace):
		// Closing the read ends ends the readers' blocked reads.
		closeFiles(outputs)
		<-drained
	}
	closeFiles(outputs)
	p.stdinMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.stdinMu.Unlock()

	end := &agentproto.EndEvent{Status: "unknown"}
	if waitErr != nil {
		msg := waitErr.Error()
		end.Error = &msg
	} else {
		end.ExitCode = int32(state.ExitCode())
		end.Exited = state.Exited()
		end.Status = state.String()
		if !state.Success() {
			end.Error = &end.Status
		}
	}
	t.mu.Lock()
	delete(t.m, p.info.Pid)
	t.mu.Unlock()
	p.publish(&agentproto.ProcessEvent{End: end})
	p.mu.Lock()
	for ch := range p.subs {
		close(ch)
	}
	p.subs = nil
	p.mu.Unlock()
	close(p.done)
}

// signal sends sig to p's process group (and so to what it started),
// falling back to p alone.
func (p *process) signal(sig unix.Signal) error {
	pid := p.cmd.Process.Pid
	if err := unix.Kill(-pid, sig); err == nil {
		return nil
	}
	if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// streamEvents sends the events of sub to s until the process ends, the
// client goes away or ctx ends, with keepalives while nothing happens.
func streamEvents(ctx context.Context, r *http.Request, p *process, sub chan *agentproto.ProcessEvent, s *rpc.Stream[agentproto.StartResponse]) error {
	defer p.unsubscribe(sub)
	if err := s.Send(&agentproto.StartResponse{Event: &agentproto.ProcessEvent{Start: &agentproto.StartEvent{Pid: p.info.Pid}}}); err != nil {
		return err
	}
	ka := time.NewTicker(rpc.KeepaliveInterval(r))
	defer ka.Stop()
	for {
		select {
		case ev, ok := <-sub:
			if !ok {
				return nil
			}
			if err := s.Send(&agentproto.StartResponse{Event: ev}); err != nil {
				return err
			}
			if ev.End != nil {
				return nil
			}
		case <-ka.C:
			if err := s.Send(&agentproto.StartResponse{Event: &agentproto.ProcessEvent{Keepalive: &struct{}{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (a *Agent) processStart(ctx context.Context, r *http.Request, req *agentproto.StartRequest, s *rpc.Stream[agentproto.StartResponse]) error {
	id, err := a.users.Who(r)
	if err != nil {
		return err
	}
	var deadline time.Duration
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Until(d)
	}
	p, sub, err := a.procs.start(req, deadline, id)
	if err != nil {
		return err
	}
	return streamEvents(ctx, r, p, sub, s)
}

func (a *Agent) processConnect(ctx context.Context, r *http.Request, req *connectRequest, s *rpc.Stream[agentproto.StartResponse]) error {
	p, err := a.procs.find(req.Process)
	if err != nil {
		return err
	}
	sub, err := p.subscribe()
	if err != nil {
		return err
	}
	return streamEvents(ctx, r, p, sub, s)
}

func (a *Agent) processList(ctx context.Context, r *http.Request, _ *listRequest) (*listResponse, error) {
	a.procs.mu.Lock()
	defer a.procs.mu.Unlock()
	resp := &listResponse{}
	for _, p := range a.procs.m {
		resp.Processes = append(resp.Processes, p.info)
	}
	return resp, nil
}

func (a *Agent) processSendInput(ctx context.Context, r *http.Request, req *sendInputRequest) (*rpc.Empty, error) {
	p, err := a.procs.find(req.Process)
	if err != nil {
		return nil, err
	}
	if req.Input == nil {
		return &rpc.Empty{}, nil
	}
	if p.pty != nil {
		if len(req.Input.Pty) == 0 && len(req.Input.Stdin) > 0 {
			return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "process %d has a PTY: send input to the pty", p.info.Pid)
		}
		if _, err := p.pty.Write(req.Input.Pty); err != nil {
			return nil, rpc.Errorf(agentproto.CodeInternal, "write to pty: %v", err)
		}
		return &rpc.Empty{}, nil
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "stdin of process %d is not open", p.info.Pid)
	}
	if _, err := p.stdin.Write(req.Input.Stdin); err != nil {
		return nil, rpc.Errorf(agentproto.CodeInternal, "write to stdin: %v", err)
	}
	return &rpc.Empty{}, nil
}

func (a *Agent) processCloseStdin(ctx context.Context, r *http.Request, req *closeStdinRequest) (*rpc.Empty, error) {
	p, err := a.procs.find(req.Process)
	if err != nil {
		return nil, err
	}
	if p.pty != nil {
		return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "process %d has a PTY: send Ctrl-D (0x04) instead", p.info.Pid)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	return &rpc.Empty{}, nil
}

func (a *Agent) processSendSignal(ctx context.Context, r *http.Request, req *sendSignalRequest) (*rpc.Empty, error) {
	p, err := a.procs.find(req.Process)
	if err != nil {
		return nil, err
	}
	var sig unix.Signal
	switch req.Signal {
	case "SIGNAL_SIGKILL", "9":
		sig = unix.SIGKILL
	case "SIGNAL_SIGTERM", "15":
		sig = unix.SIGTERM
	default:
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "unsupported signal %q", req.Signal)
	}
	if err := p.signal(sig); err != nil {
		return nil, rpc.Errorf(agentproto.CodeInternal, "signal process %d: %v", p.info.Pid, err)
	}
	return &rpc.Empty{}, nil
}

func (a *Agent) processUpdate(ctx context.Context, r *http.Request, req *updateRequest) (*rpc.Empty, error) {
	p, err := a.procs.find(req.Process)
	if err != nil {
		return nil, err
	}
	if req.Pty != nil && req.Pty.Size != nil {
		if p.pty == nil {
			return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "process %d has no PTY", p.info.Pid)
		}
		if err := setPTYSize(p.pty, req.Pty.Size); err != nil {
			return nil, rpc.Errorf(agentproto.CodeInternal, "resize pty: %v", err)
		}
	}
	return &rpc.Empty{}, nil
}

// openPTY opens a new pseudo-terminal pair in the sandbox's devpts.
func openPTY(size *agentproto.PTYSize) (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlock: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	if size != nil {
		if err := setPTYSize(m, size); err != nil {
			m.Close()
			s.Close()
			return nil, nil, err
		}
	}
	return m, s, nil
}

func setPTYSize(f *os.File, size *agentproto.PTYSize) error {
	return unix.IoctlSetWinsize(int(f.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(size.Rows), Col: uint16(size.Cols)})
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// userFromRequest returns the user named in the request's Basic
// authorization (envd's way of choosing who runs a command), or "".
func userFromRequest(r *http.Request) string {
	if u, _, ok := r.BasicAuth(); ok {
		return u
	}
	return r.URL.Query().Get("username")
}
