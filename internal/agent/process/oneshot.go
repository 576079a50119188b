package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/tasks"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// RunOnce serves agentproto.RunPath: airlock run's command in a sandbox
// the daemon took from its pool, which it discards after. It runs as the
// direct path runs it: the environment and working directory as sent, a
// command not found or a working directory missing reported before
// anything runs, and, once the command exits, whatever it left running
// killed (as the direct path's init does by exiting), so that its output
// ends with it. The daemon keeps the time limit and the statistics: code
// in the sandbox can kill its agent, never the host's timer.
func (s *Service) RunOnce(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	// stdin keeps coming in the request body while the answer streams.
	_ = rc.EnableFullDuplex()
	typ, payload, err := agentproto.ReadFrame(r.Body, agentproto.MaxFrame)
	var req agentproto.RunRequest
	if err == nil && typ != agentproto.FrameRequest {
		err = fmt.Errorf("frame %q before the request", typ)
	}
	if err == nil {
		err = agentproto.DecodeStrict(payload, &req)
	}
	if err == nil && (len(req.Argv) == 0 || !filepath.IsAbs(req.Cwd)) {
		err = errors.New("no command, or a relative working directory")
	}
	if err != nil {
		http.Error(w, "bad run request: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	out := &frameWriter{w: w, rc: rc}
	cmd, stdin, outputs, err := s.startOnce(&req)
	if err != nil {
		out.send(agentproto.FrameSetupError, []byte(err.Error()))
		return
	}
	out.json(agentproto.FrameStarted, map[string]int{"pid": cmd.Process.Pid})
	if stdin != nil {
		go feedStdin(r.Body, stdin)
	}
	var readers sync.WaitGroup
	for i, f := range outputs {
		typ := []byte{agentproto.FrameStdout, agentproto.FrameStderr}[i]
		readers.Go(func() { out.copy(typ, f) })
	}
	state, err := cmd.Process.Wait()
	// What the command left running dies with it, as in the direct path,
	// where init's exit ends the sandbox's PID namespace. kill(-1) spares
	// the agent and the namespace's init; the sandbox is discarded after.
	_ = unix.Kill(-1, unix.SIGKILL)
	drain(&readers, outputs)
	if err != nil {
		out.send(agentproto.FrameSetupError, []byte("wait: "+err.Error()))
		return
	}
	ws := state.Sys().(syscall.WaitStatus)
	out.json(agentproto.FrameExit, agentproto.RunExit{WaitStatus: uint32(ws)})
}

// startOnce starts req's command as the sandbox's user. It returns the
// parent's end of its stdin (nil: /dev/null) and of its stdout and
// stderr. Its errors are the user's to read: they name the command or
// the directory, as the direct path's.
func (s *Service) startOnce(req *agentproto.RunRequest) (*exec.Cmd, *os.File, []*os.File, error) {
	argv0, err := agentproto.LookPath(req.Argv[0], req.Env)
	if err != nil {
		return nil, nil, nil, err
	}
	if fi, err := os.Stat(req.Cwd); err != nil {
		return nil, nil, nil, fmt.Errorf("workdir %s: %w", req.Cwd, errors.Unwrap(err))
	} else if !fi.IsDir() {
		return nil, nil, nil, fmt.Errorf("workdir %s: %w", req.Cwd, unix.ENOTDIR)
	}
	cmd := &exec.Cmd{Path: argv0, Args: req.Argv, Env: req.Env, Dir: req.Cwd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.users.Credential(s.users.User())}
	// The child's ends are closed once it started; the parent's, on error.
	var stdin *os.File
	var outputs, childEnds []*os.File
	defer func() { closeFiles(childEnds) }()
	fail := func(err error) (*exec.Cmd, *os.File, []*os.File, error) {
		closeFiles(outputs)
		if stdin != nil {
			stdin.Close()
		}
		return nil, nil, nil, err
	}
	if req.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("pipe: %w", err))
		}
		cmd.Stdin, stdin = r, w
		childEnds = append(childEnds, r)
	}
	for _, set := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("pipe: %w", err))
		}
		*set = w
		outputs, childEnds = append(outputs, r), append(childEnds, w)
	}
	err = tasks.StartWithin(cmd, tasks.Child{Nproc: req.Pids, FileSize: req.FileSize, Umask: &req.Umask})
	if err != nil {
		return fail(fmt.Errorf("start %s: %w", req.Argv[0], errors.Unwrap(err)))
	}
	return cmd, stdin, outputs, nil
}

// feedStdin writes the request's stdin frames to the command's stdin
// until their end, the command's, or the request's.
func feedStdin(body io.Reader, stdin *os.File) {
	defer stdin.Close()
	for {
		typ, data, err := agentproto.ReadFrame(body, agentproto.MaxFrame)
		if err != nil || typ != agentproto.FrameStdin {
			return // FrameStdinEnd, or the request is gone
		}
		if _, err := stdin.Write(data); err != nil {
			return // the command closed its stdin, or ended
		}
	}
}

// frameWriter sends frames on a response, each flushed at once: the two
// output streams write from goroutines of their own.
type frameWriter struct {
	mu     sync.Mutex
	w      io.Writer
	rc     *http.ResponseController
	broken bool
}

func (f *frameWriter) send(typ byte, payload []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.broken {
		return // the daemon went away: it kills the sandbox
	}
	if agentproto.WriteFrame(f.w, typ, payload) != nil || f.rc.Flush() != nil {
		f.broken = true
	}
}

func (f *frameWriter) json(typ byte, v any) {
	b, _ := json.Marshal(v) // of the agent's own types: cannot fail
	f.send(typ, b)
}

// copy sends what r holds, as frames of type typ, until its end.
func (f *frameWriter) copy(typ byte, r io.Reader) {
	buf := make([]byte, chunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			f.send(typ, buf[:n])
		}
		if err != nil {
			return
		}
	}
}
