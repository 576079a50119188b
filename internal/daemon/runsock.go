package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/runsock"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// runServer answers airlock run on the state directory's socket (package
// runsock): a command runs in a sandbox of the pool of the host's view,
// which is discarded after, with what the direct path decides on the
// host (the time limit, the output limit, the statistics) decided here
// the same way.
type runServer struct {
	m *sandbox.Manager
	// sealed: the server gives no sandbox the internet, and so no run.
	sealed bool
	log    *slog.Logger
	ln     *net.UnixListener
	lock   *os.File
	path   string
	wg     sync.WaitGroup
}

// claimTimeout is how long a client may take to say go once its sandbox
// is claimed; requestTimeout how long to send its request.
const (
	claimTimeout   = 5 * time.Second
	requestTimeout = 5 * time.Second
)

// listenRun opens the socket in dir for m, or returns nil where another
// daemon of the state directory serves it already (they may share one).
// The socket is the daemon's alone: the directory is 0700, the socket
// 0600, and a peer that is not root is refused (peer credentials).
func listenRun(dir string, m *sandbox.Manager, sealed bool, log *slog.Logger) (*runServer, error) {
	lock, err := os.OpenFile(filepath.Join(dir, runsock.LockName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("run socket: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		log.Info("another daemon of this state directory serves airlock run")
		return nil, nil
	}
	addr, release, err := runsock.Addr(dir)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("run socket: %w", err)
	}
	defer release()
	// Whatever is there is a dead daemon's: the live one holds the lock.
	if err := os.Remove(addr); err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("run socket: %w", err)
	}
	// Bound, then made 0600: the state directory (0700) keeps others out
	// meanwhile. (A umask would be the whole process's, pool fillers'
	// forks included.)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err == nil {
		if err = os.Chmod(addr, 0o600); err != nil {
			ln.Close()
		}
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("run socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // removed by path in close, not by addr
	return &runServer{m: m, sealed: sealed, log: log, ln: ln, lock: lock, path: filepath.Join(dir, runsock.SocketName)}, nil
}

// serve answers until close.
func (s *runServer) serve() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		s.wg.Go(func() {
			defer c.Close()
			if !runsock.PeerIsRoot(c) {
				return
			}
			s.handle(c)
		})
	}
}

// close stops answering and waits for the runs going on, which the
// manager's shutdown ends.
func (s *runServer) close() {
	if s == nil {
		return
	}
	s.ln.Close()
	os.Remove(s.path)
	s.lock.Close()
}

// wait waits for the runs to end (after the manager's shutdown).
func (s *runServer) wait() {
	if s != nil {
		s.wg.Wait()
	}
}

// handle serves one client.
func (s *runServer) handle(c *net.UnixConn) {
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	typ, payload, err := agentproto.ReadFrame(c, runsock.MaxRequest)
	if err != nil || typ != agentproto.FrameRequest {
		return
	}
	var req runsock.Request
	if err := agentproto.DecodeStrict(payload, &req); err != nil || req.V != runsock.Version {
		direct(c, fmt.Sprintf("this daemon speaks version %d of the run protocol", runsock.Version))
		return
	}
	sb, why := s.claim(&req)
	if sb == nil {
		direct(c, why)
		return
	}
	defer s.m.End(sb)
	if agentproto.WriteFrame(c, runsock.FrameClaimed, nil) != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(claimTimeout))
	if typ, _, err := agentproto.ReadFrame(c, 0); err != nil || typ != runsock.FrameGo {
		return // it gave up, and runs the command itself
	}
	c.SetReadDeadline(time.Time{})
	s.run(c, sb, &req)
}

// direct tells the client to run the command itself, and why.
func direct(c net.Conn, why string) {
	agentproto.WriteFrame(c, runsock.FrameDirect, []byte(why))
}

// claim takes a sandbox of the pool of the host's view for req, or says
// why there is none to take: nothing is started for a run.
func (s *runServer) claim(req *runsock.Request) (*sandbox.Sandbox, string) {
	name, _, ok := s.m.RunTemplate(req.Backend)
	switch {
	case !ok:
		return nil, "the daemon pools no sandbox of the host's view on " + req.Backend
	case len(req.Argv) == 0 || req.Timeout <= 0 || req.OutputLimit < 0:
		return nil, "a request without a command or a time limit"
	case s.sealed && req.Network.Mode != policy.NetNone:
		return nil, "this server is sealed: its sandboxes have no network"
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	// The sandbox outlives the command's time limit a little: the timer
	// here kills it first, and the manager's is the backstop.
	sb, err := s.m.Create(ctx, sandbox.CreateRequest{
		TemplateID: name, TTL: req.Timeout + 30*time.Second, PoolOnly: true, Network: req.Network,
		// Lower ones are applied to the claimed sandbox; higher ones, or
		// a backend that cannot, are declined.
		Limits: sandbox.Limits{MemoryBytes: req.MemoryBytes, CPUs: req.CPUs, Pids: req.Pids, DiskBytes: req.DiskBytes},
		// The run's alone: no client of the API finds it.
		Private: true, ClientID: "airlock-run",
	})
	if err != nil {
		return nil, declined(err, s.log)
	}
	// Nothing of the client has run in it: its code files go in now, as
	// a sandbox built for the run has them before its command starts.
	if len(req.Files) > 0 {
		if err := sb.PlaceCode(req.Files); err != nil {
			s.m.End(sb)
			if errors.Is(err, sandbox.ErrNoCodeFiles) {
				return nil, err.Error()
			}
			s.log.Warn("airlock run: code files", "sandbox", sb.ID, "err", err)
			return nil, "the code files could not be placed in the pooled sandbox"
		}
	}
	return sb, ""
}

// declined is why a claim failed, in words for the client: the
// manager's refusals as they are, anything else (which may name host
// paths) logged.
func declined(err error, log *slog.Logger) string {
	for _, public := range []error{sandbox.ErrPoolEmpty, sandbox.ErrInvalid, sandbox.ErrTooMany,
		sandbox.ErrShuttingDown, sandbox.ErrNoLowering} {
		if errors.Is(err, public) {
			return err.Error()
		}
	}
	log.Warn("airlock run: claim", "err", err)
	return "the daemon could not prepare a pooled sandbox (its log says why)"
}

// run runs req's command in sb, relaying its output and stdin over c,
// under req's time and output limits, and sends how it ended. It returns
// once the client hung up, or a little after the result: the sandbox's
// teardown, and its pool's refill, come after the client's exit rather
// than compete with it for the CPU.
func (s *runServer) run(c *net.UnixConn, sb *sandbox.Sandbox, req *runsock.Request) {
	ctx, cancel := context.WithCancel(context.Background())
	res := s.execute(ctx, c, sb, req, cancel)
	if agentproto.WriteJSONFrame(c, runsock.FrameResult, res) == nil {
		select {
		case <-ctx.Done():
		case <-time.After(hangUpWait):
		}
	}
	cancel()
}

// hangUpWait bounds how long the sandbox of a finished run waits for its
// client to hang up.
const hangUpWait = time.Second

// execute runs the command, relaying output and stdin; cancel is called
// when the client hangs up.
func (s *runServer) execute(ctx context.Context, c *net.UnixConn, sb *sandbox.Sandbox, req *runsock.Request, cancel func()) *runsock.Result {
	before := sb.CountersAtStart()
	// Reading the client: its stdin, and its end, which kills the
	// sandbox (as the direct path's sandbox dies with airlock run). The
	// stdin it sends goes to the agent from a goroutine of its own,
	// through a bounded queue: a command that does not read its stdin
	// holds that one up, never the watch for the client's end.
	stdinR, stdinW := io.Pipe()
	// Once the run is over, a stdin write still waiting fails.
	defer stdinR.CloseWithError(io.ErrClosedPipe)
	queue := make(chan []byte, 16)
	s.wg.Go(func() {
		defer stdinW.Close()
		for data := range queue {
			if data == nil {
				stdinW.Close()
				continue
			}
			if _, err := stdinW.Write(data); err != nil {
				for range queue { // drained until the reader ends
				}
				return
			}
		}
	})
	s.wg.Go(func() { s.watchHangUp(ctx, c, sb) })
	s.wg.Go(func() {
		defer cancel()
		defer close(queue)
		eof := false
		for {
			typ, data, err := agentproto.ReadFrame(c, agentproto.MaxFrame)
			if err != nil {
				s.m.End(sb)
				return
			}
			switch {
			case typ == agentproto.FrameStdin && !eof:
				queue <- data
			case typ == agentproto.FrameStdinEnd && !eof:
				eof = true
				queue <- nil // the end: the writer closes stdin
			}
		}
	})
	// The host's timer, from before the agent is asked to start the
	// command: code in the sandbox can kill its agent, and an agent that
	// never answers must not hold the run open either.
	var (
		mu       sync.Mutex // timedOut, between the timer and this goroutine
		timedOut bool
	)
	timer := time.AfterFunc(req.Timeout, func() {
		mu.Lock()
		timedOut = true
		mu.Unlock()
		s.m.End(sb)
	})
	defer timer.Stop()
	agent := &agentproto.Client{Transport: sb.Transport()}
	stream, err := agent.Run(ctx, agentproto.RunRequest{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, Umask: req.Umask, Stdin: req.Stdin, Pids: req.Pids, FileSize: req.DiskBytes}, stdinR)
	if err != nil {
		s.log.Warn("airlock run: agent", "sandbox", sb.ID, "err", err)
		return &runsock.Result{SetupError: "the pooled sandbox's agent did not start the command"}
	}
	defer stream.Close()
	var (
		res     runsock.Result
		started time.Time
		exit    *agentproto.RunExit
	)
	out := backend.NewCappedWriter(frameWriter{c, agentproto.FrameStdout}, req.OutputLimit)
	errOut := backend.NewCappedWriter(frameWriter{c, agentproto.FrameStderr}, req.OutputLimit)
read:
	for {
		typ, data, err := agentproto.ReadFrame(stream, agentproto.MaxFrame)
		if err != nil {
			break // the box ended: killed by the timer, the client, or its memory
		}
		switch typ {
		case agentproto.FrameSetupError:
			return &runsock.Result{SetupError: string(data)}
		case agentproto.FrameStarted:
			started = time.Now()
		case agentproto.FrameStdout:
			out.Write(data)
		case agentproto.FrameStderr:
			errOut.Write(data)
		case agentproto.FrameExit:
			exit = new(agentproto.RunExit)
			if json.Unmarshal(data, exit) != nil {
				exit = nil
			}
			break read
		}
	}
	timer.Stop()
	if !started.IsZero() {
		res.Duration = time.Since(started)
	}
	after, _ := sb.Counters(context.Background())
	res.CPU = max(after.CPU-before.CPU, 0)
	res.MaxMemoryBytes = after.MaxMemory
	res.StdoutTruncated, res.StderrTruncated = out.Truncated(), errOut.Truncated()
	mu.Lock()
	res.TimedOut = timedOut
	mu.Unlock()
	switch {
	case exit != nil && syscall.WaitStatus(exit.WaitStatus).Signaled():
		ws := syscall.WaitStatus(exit.WaitStatus)
		res.ExitCode, res.Signal = -1, unix.SignalName(ws.Signal())
	case exit != nil:
		res.ExitCode = syscall.WaitStatus(exit.WaitStatus).ExitStatus()
	default:
		// The box died before the command's end was told: as when the
		// direct path's init dies, the command was killed.
		res.ExitCode, res.Signal = -1, "SIGKILL"
	}
	if res.TimedOut {
		res.ExitCode, res.Signal = -1, "SIGKILL"
	}
	res.OOMKilled = !res.TimedOut && res.Signal == "SIGKILL" && after.OOMKills > before.OOMKills
	return &res
}

// watchHangUp ends sb once the client hung up, until ctx ends: the
// reader of the client sees its end too, unless it waits for a command
// that does not read its stdin; the kernel says so while data is unread
// (POLLRDHUP), checked every hangUpPoll.
func (s *runServer) watchHangUp(ctx context.Context, c *net.UnixConn, sb *sandbox.Sandbox) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	tick := time.NewTicker(hangUpPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		hup := false
		raw.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
				hup = fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
			}
		})
		if hup {
			s.m.End(sb)
			return
		}
	}
}

// hangUpPoll is how often watchHangUp asks.
const hangUpPoll = 250 * time.Millisecond

// frameWriter writes each Write as one frame of its type.
type frameWriter struct {
	c   net.Conn
	typ byte
}

func (w frameWriter) Write(b []byte) (int, error) {
	if err := agentproto.WriteFrame(w.c, w.typ, b); err != nil {
		return 0, err
	}
	return len(b), nil
}
