package process

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agent/tasks"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Start starts a process as the request's user and streams its events
// until it ends. The call's deadline (the SDK's timeoutMs) kills it.
func (s *Service) Start(ctx context.Context, r *http.Request, req *agentproto.StartRequest, st *rpc.Stream[agentproto.StartResponse]) error {
	id, err := s.users.Who(r)
	if err != nil {
		return err
	}
	var deadline time.Duration
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Until(d)
	}
	p, sub, err := s.start(req, deadline, id)
	if err != nil {
		return err
	}
	return streamEvents(ctx, r, p, sub, st)
}

// start launches req's command as id and registers it; the channel is
// the caller's subscription to its events, from the first.
func (s *Service) start(req *agentproto.StartRequest, deadline time.Duration, id identity.ID) (*process, chan *agentproto.ProcessEvent, error) {
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
	cmd.Env = s.env.ForID(id, cfg.Envs)
	p := &process{
		info: processInfo{Config: cfg, Tag: req.Tag},
		cmd:  cmd,
		subs: map[chan *agentproto.ProcessEvent]struct{}{},
		done: make(chan struct{}),
	}
	outputs, childEnds, err := p.connectIO(req)
	defer closeFiles(childEnds)
	if err != nil {
		return nil, nil, err
	}
	cmd.SysProcAttr.Credential = s.users.Credential(id)
	sub, _ := p.subscribe() // cannot fail: p has not started
	if err := tasks.Start(cmd); err != nil {
		closeFiles(outputs)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, nil, rpc.Errorf(agentproto.CodeInvalidArgument, "start %s: %v", cfg.Cmd, errors.Unwrap(err))
	}
	p.info.Pid = uint32(cmd.Process.Pid)
	s.add(p)
	var kill *time.Timer
	if deadline > 0 {
		// The SDK's timeoutMs: the command is killed when it passes.
		kill = time.AfterFunc(deadline, func() { p.signal(unix.SIGKILL) })
	}
	go s.run(p, outputs, kill)
	return p, sub, nil
}

// connectIO gives p's command its stdio: a new PTY, or pipes (stdin
// unless the request says otherwise), and its session or process group.
// It returns the parent's ends to read until they end, and the child's,
// which the caller closes once the command started. On error it has
// closed what it opened of the first.
func (p *process) connectIO(req *agentproto.StartRequest) (outputs, childEnds []*os.File, err error) {
	cmd := p.cmd
	if req.Pty != nil {
		master, slave, err := openPTY(req.Pty.Size)
		if err != nil {
			return nil, nil, rpc.Errorf(agentproto.CodeInternal, "open pty: %v", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// Its own session with the PTY as controlling terminal, as a login
		// shell expects.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		p.pty = master
		return []*os.File{master}, []*os.File{slave}, nil
	}
	for _, set := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			closeFiles(outputs)
			return nil, childEnds, rpc.Errorf(agentproto.CodeInternal, "pipe: %v", err)
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
			return nil, childEnds, rpc.Errorf(agentproto.CodeInternal, "pipe: %v", err)
		}
		cmd.Stdin = r
		childEnds = append(childEnds, r)
		p.stdin = w
	}
	// Its own process group, so that a signal reaches what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return outputs, childEnds, nil
}

// streamEvents sends the events of sub to st until the process ends, the
// client goes away or ctx ends, with keepalives while nothing happens.
func streamEvents(ctx context.Context, r *http.Request, p *process, sub chan *agentproto.ProcessEvent, st *rpc.Stream[agentproto.StartResponse]) error {
	defer p.unsubscribe(sub)
	if err := st.Send(&agentproto.StartResponse{Event: &agentproto.ProcessEvent{Start: &agentproto.StartEvent{Pid: p.info.Pid}}}); err != nil {
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
			if ev.End != nil && ctx.Err() != nil {
				// Killed at the call's deadline: the process's end and
				// the deadline are both ready by now, and select would
				// pick either. The caller asked for a timeout, and is
				// told so, as envd does.
				return ctx.Err()
			}
			if err := st.Send(&agentproto.StartResponse{Event: ev}); err != nil {
				return err
			}
			if ev.End != nil {
				return nil
			}
		case <-ka.C:
			if err := st.Send(&agentproto.StartResponse{Event: &agentproto.ProcessEvent{Keepalive: &struct{}{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
