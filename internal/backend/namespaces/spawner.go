package namespaces

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/rangelock"
)

// A daemon forks its sandboxes' inits through a spawner process: itself,
// started again in a mode of its own (SpawnerArg), that forks each init
// as forkOnThread would and reports it to the daemon.
//
// Why a process: each init is forked with CLONE_NEWUSER, and Go then
// forks without CLONE_VM (the parent writes the child's id maps while
// the child waits): the kernel copies the forking process's page tables,
// and marks all of its memory copy-on-write until the child execs. A
// daemon holding thousands of sandboxes is hundreds of MiB; the spawner
// is a few. Forking the daemon was half of its CPU time per create.
//
// The daemon and the spawner share a socket pair and nothing else. The
// daemon sends each fork (spawnRequest) with its files (SCM_RIGHTS); the
// spawner answers with init's pid and a pidfd of it, and later with how
// init ended (spawnReport). Deaths chain: the spawner dies with the
// daemon (its parent-death signal, and the end of its socket), every init
// with the spawner (its parent-death signal).

// SpawnerArg, as a program's first argument, makes it a spawner: see
// ServeSpawner.
const SpawnerArg = "airlock-spawner"

// ForkThroughSpawner makes this process fork every sandbox's init through
// a spawner process started from its own executable, which must call
// ServeSpawner when given SpawnerArg. Call it before any sandbox starts.
func ForkThroughSpawner() { forkInit = spawners.fork }

// spawnRequest is what the daemon asks of its spawner, by Kind:
//
//   - a fork (Kind ""), sent with its files in this order: stdin (if
//     Stdin), stdout, stderr, the network namespace (if NetNS), the
//     cgroup (if Cgroup), then init's descriptors 3, 4, …;
//   - reqHold: keep Tag, Info and the message's files with init ID for
//     as long as it lives, for a later daemon (a keeper's, keeper.go);
//   - reqLocks: hold the message's files, lock descriptions of Paths, for
//     as long as the spawner lives;
//   - reqExec: start Argv with Env, its files stdout, stderr, then its
//     descriptors 3, 4, …, in a session of its own, as root (a backend
//     that keeps its processes through this one's: KeepAlive);
//   - reqRetire: fork no more, and exit once the last init has ended.
type spawnRequest struct {
	Kind   string `json:",omitempty"`
	ID     uint64
	Base   int             `json:",omitempty"`
	Path   string          `json:",omitempty"`
	Stdin  bool            `json:",omitempty"`
	NetNS  bool            `json:",omitempty"`
	Cgroup bool            `json:",omitempty"`
	Files  int             // how many files the message carries in all
	Tag    string          `json:",omitempty"`
	Info   json.RawMessage `json:",omitempty"`
	Paths  []string        `json:",omitempty"`
	Argv   []string        `json:",omitempty"`
	Env    []string        `json:",omitempty"`
}

const (
	reqExec   = "exec"
	reqHold   = "hold"
	reqLocks  = "locks"
	reqRetire = "retire"
)

// spawnReport is a fork's outcome: Pid (with init's pidfd as the report's
// one file) or Err; then, once init has ended, Exited with its status and
// the CPU time of init and its reaped descendants.
//
// A keeper tells a daemon that connects to it (keeper.go) what it holds:
// a Kept report for each init, with its Tag and Info and, unless it has
// Exited, its pidfd and the files held with it; then an Inventory with
// the largest request ID it has seen, its executable (exeID), and its
// lock descriptions, of Paths, as files.
type spawnReport struct {
	ID        uint64
	Pid       int             `json:",omitempty"`
	Err       string          `json:",omitempty"`
	Exited    bool            `json:",omitempty"`
	Status    uint32          `json:",omitempty"`
	CPU       int64           `json:",omitempty"` // nanoseconds
	Kept      bool            `json:",omitempty"`
	Tag       string          `json:",omitempty"`
	Info      json.RawMessage `json:",omitempty"`
	Inventory bool            `json:",omitempty"`
	Next      uint64          `json:",omitempty"`
	Exe       string          `json:",omitempty"`
	Paths     []string        `json:",omitempty"`
	Retired   bool            `json:",omitempty"`
}

// maxSpawnFiles bounds the files of one request: the kernel passes at
// most 253 (SCM_MAX_FD) in one message.
const maxSpawnFiles = 250

// spawnFor forks the init that req and its files describe.
func spawnFor(req *spawnRequest, files []*os.File) (childInit, error) {
	f := &initFork{base: req.Base, path: req.Path, cgroupFD: -1}
	take := func() *os.File {
		if len(files) == 0 {
			return nil
		}
		file := files[0]
		files = files[1:]
		return file
	}
	if req.Stdin {
		f.stdin = take()
	}
	f.stdout, f.stderr = take(), take()
	if req.NetNS {
		f.netns = take()
	}
	if req.Cgroup {
		if cg := take(); cg != nil {
			f.cgroupFD = int(cg.Fd())
		}
	}
	f.files = files
	if f.stderr == nil || (req.NetNS && f.netns == nil) || (req.Cgroup && f.cgroupFD < 0) {
		return childInit{}, errors.New("spawner: files missing from the request")
	}
	p, err := forkOnThread(f)
	if err != nil {
		return childInit{}, err
	}
	return p.(childInit), nil
}

// spawnExec starts the command req and its files describe, on the
// spawner thread: it dies with the spawner (its parent-death signal).
func spawnExec(req *spawnRequest, files []*os.File) (childInit, error) {
	if len(req.Argv) == 0 || len(files) < 2 {
		return childInit{}, errors.New("spawner: an exec without a command or its output")
	}
	cmd := &exec.Cmd{
		Path: req.Argv[0], Args: req.Argv, Env: req.Env,
		Stdout: files[0], Stderr: files[1], ExtraFiles: files[2:],
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL},
	}
	var err error
	onSpawner(func() { err = cmd.Start() })
	if err != nil {
		return childInit{}, err
	}
	return childInit{cmd}, nil
}

// receivedFiles are the descriptors of a message's SCM_RIGHTS. On an
// error, those it found are closed.
func receivedFiles(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, got...)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "spawned")
	}
	if len(msgs) > 0 && len(fds) == 0 {
		return nil, errors.New("control message without descriptors")
	}
	return files, nil
}

// The daemon's side.

// spawnerSet is the spawner process of this one, started when first
// needed and again after it died.
type spawnerSet struct {
	mu      sync.Mutex
	current *spawner
	// keep, if set, makes the spawners keepers (keeper.go): KeepAlive.
	keep *keeping
}

// keeping is where keepers listen, and the lock descriptions they hold.
type keeping struct {
	dir   string
	locks []*rangelock.Locks
}

var spawners spawnerSet

// spawner is one spawner process, as the daemon sees it.
type spawner struct {
	sock    int
	sendMu  sync.Mutex // held for each send, and to close sock
	closed  bool       // sock is closed: its number may be another file's
	mu      sync.Mutex
	next    uint64
	procs   map[uint64]*spawnedInit // forks asked for, until their init has ended
	dead    bool
	keeper  bool   // it outlives this process (keeper.go)
	exe     string // a keeper's executable (exeID), once reattached
	retired bool   // a keeper that forks no more
}

// fork forks f through the spawner, starting one if none runs.
func (set *spawnerSet) fork(f *initFork) (initProc, error) {
	sp, err := set.spawner()
	if err != nil {
		return nil, err
	}
	return sp.fork(f)
}

// spawner is the spawner to ask, started if none runs.
func (set *spawnerSet) spawner() (*spawner, error) {
	set.mu.Lock()
	defer set.mu.Unlock()
	sp := set.current
	if sp == nil || sp.isDead() {
		var err error
		if sp, err = startSpawner(set.keep); err != nil {
			return nil, err
		}
		set.current = sp
	}
	return sp, nil
}

// startSpawner starts a spawner from this process's executable, a keeper
// if keep is set. It is forked on the spawner thread, which never exits:
// the spawner's parent-death signal fires when the thread that forked it
// does (spawn.go).
func startSpawner(keep *keeping) (*spawner, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner socket: %w", err)
	}
	theirs := os.NewFile(uintptr(pair[1]), "spawner")
	defer theirs.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{"airlock", SpawnerArg},
		Env:         []string{},
		Stderr:      os.Stderr,
		ExtraFiles:  []*os.File{theirs},
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	if keep != nil {
		// Not killed with this process, nor by a signal to its group.
		ln, path, err := listenKeeper(keep.dir)
		if err != nil {
			unix.Close(pair[0])
			return nil, err
		}
		defer ln.Close()
		cmd.Args = append(cmd.Args, path)
		cmd.ExtraFiles = append(cmd.ExtraFiles, ln)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	onSpawner(func() { err = cmd.Start() })
	if err != nil {
		unix.Close(pair[0])
		return nil, fmt.Errorf("start the spawner: %w", err)
	}
	sp := &spawner{sock: pair[0], procs: map[uint64]*spawnedInit{}, keeper: keep != nil}
	go func() {
		backend.AwaitExit(cmd.Process)
		cmd.Wait()
	}()
	go sp.read()
	if keep != nil {
		if err := sp.holdLocks(keep.locks); err != nil {
			sp.send(spawnRequest{Kind: reqRetire}, nil)
			return nil, err
		}
	}
	return sp, nil
}

// holdLocks has a keeper hold the descriptions of locks.
func (sp *spawner) holdLocks(locks []*rangelock.Locks) error {
	req := spawnRequest{Kind: reqLocks}
	var fds []int
	for _, l := range locks {
		f, err := l.File()
		if err != nil {
			return fmt.Errorf("keeper: %w", err)
		}
		req.Paths = append(req.Paths, l.Path)
		fds = append(fds, int(f.Fd()))
	}
	return sp.send(req, fds)
}

// send sends req with fds, their count set.
func (sp *spawner) send(req spawnRequest, fds []int) error {
	req.Files = len(fds)
	msg, err := json.Marshal(&req)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	sp.sendMu.Lock()
	defer sp.sendMu.Unlock()
	if sp.closed {
		return errSpawnerDied
	}
	return unix.Sendmsg(sp.sock, msg, oob, nil, unix.MSG_NOSIGNAL)
}

func (sp *spawner) isDead() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.dead
}

// fork sends f and waits for the spawner's answer.
func (sp *spawner) fork(f *initFork) (initProc, error) {
	req := spawnRequest{Base: f.base, Path: f.path, Stdin: f.stdin != nil, NetNS: f.netns != nil, Cgroup: f.cgroupFD >= 0}
	var fds []int
	if f.stdin != nil {
		fds = append(fds, int(f.stdin.Fd()))
	}
	fds = append(fds, int(f.stdout.Fd()), int(f.stderr.Fd()))
	if f.netns != nil {
		fds = append(fds, int(f.netns.Fd()))
	}
	if f.cgroupFD >= 0 {
		fds = append(fds, f.cgroupFD)
	}
	for _, file := range f.files {
		fds = append(fds, int(file.Fd()))
	}
	if len(fds) > maxSpawnFiles {
		return nil, fmt.Errorf("init would get %d files, more than %d", len(fds), maxSpawnFiles)
	}
	p, err := sp.start(req, fds)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// start sends req with fds and waits for the spawner's answer.
func (sp *spawner) start(req spawnRequest, fds []int) (*spawnedInit, error) {
	p := &spawnedInit{sp: sp, started: make(chan spawnReport, 1), ended: make(chan spawnReport, 1)}
	sp.mu.Lock()
	if sp.dead {
		sp.mu.Unlock()
		return nil, errSpawnerDied
	}
	sp.next++
	req.ID = sp.next
	sp.procs[req.ID] = p
	sp.mu.Unlock()
	if err := sp.send(req, fds); err != nil {
		sp.forget(req.ID)
		return nil, fmt.Errorf("spawner: %w", err)
	}
	r := <-p.started
	if r.Err != "" {
		sp.forget(req.ID)
		return nil, errors.New(r.Err)
	}
	p.pid, p.id = r.Pid, req.ID
	return p, nil
}

var errSpawnerDied = errors.New("the spawner process died")

func (sp *spawner) forget(id uint64) {
	sp.mu.Lock()
	delete(sp.procs, id)
	sp.mu.Unlock()
}

// read takes the spawner's reports to their forks until it dies.
func (sp *spawner) read() {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(sp.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			sp.died()
			return
		}
		files, ferr := receivedFiles(oob[:oobn])
		var r spawnReport
		if json.Unmarshal(buf[:n], &r) != nil || ferr != nil || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			// Cannot happen: the spawner is this program. Should it, no
			// fork may wait for an answer that will not come: the
			// spawner exits once its socket is closed, and its inits
			// with it.
			closeAll(files)
			sp.died()
			return
		}
		sp.mu.Lock()
		p := sp.procs[r.ID]
		if r.Exited {
			delete(sp.procs, r.ID)
		}
		sp.mu.Unlock()
		switch {
		case p == nil:
			closeAll(files)
		case r.Exited:
			p.ended <- r
		default:
			if len(files) == 1 && r.Err == "" {
				p.pidfd = files[0]
			} else {
				closeAll(files)
				if r.Err == "" {
					r.Err = "spawner: no pidfd for init"
				}
			}
			p.started <- r
		}
	}
}

// died ends every fork of a spawner that is gone: one not yet started
// fails; a started init was killed with it (Pdeathsig), and is reported
// so once its pidfd says it has ended.
func (sp *spawner) died() {
	sp.mu.Lock()
	sp.dead = true
	procs := sp.procs
	sp.procs = nil
	sp.mu.Unlock()
	// No send may be under way, or follow, once the number is free.
	sp.sendMu.Lock()
	sp.closed = true
	unix.Close(sp.sock)
	sp.sendMu.Unlock()
	for _, p := range procs {
		if p.pidfd == nil {
			p.started <- spawnReport{Err: errSpawnerDied.Error()}
			continue
		}
		go func() {
			// One watcher for them all, not a thread each: a spawner
			// may take thousands of sandboxes with it.
			if !backend.AwaitPidfd(int(p.pidfd.Fd())) {
				fds := []unix.PollFd{{Fd: int32(p.pidfd.Fd()), Events: unix.POLLIN}}
				for {
					if _, err := unix.Poll(fds, -1); err != unix.EINTR {
						break
					}
				}
			}
			p.ended <- spawnReport{Exited: true, Status: uint32(syscall.SIGKILL), Err: errSpawnerDied.Error()}
		}()
	}
}

// spawnedInit is an init forked by a spawner.
type spawnedInit struct {
	sp      *spawner
	id      uint64 // the spawner's
	pid     int
	started chan spawnReport
	ended   chan spawnReport
	mu      sync.Mutex
	pidfd   *os.File // nil once init has been reaped
}

func (p *spawnedInit) Pid() int { return p.pid }

func (p *spawnedInit) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd == nil {
		return os.ErrProcessDone
	}
	err := unix.PidfdSendSignal(int(p.pidfd.Fd()), sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return os.ErrProcessDone // ended, its end not yet reported
	}
	return err
}

func (p *spawnedInit) Wait() (unix.WaitStatus, time.Duration, error) {
	r := <-p.ended
	p.mu.Lock()
	p.pidfd.Close()
	p.pidfd = nil
	p.mu.Unlock()
	if r.Err != "" && r.Err != errSpawnerDied.Error() {
		return 0, 0, errors.New(r.Err)
	}
	return unix.WaitStatus(r.Status), time.Duration(r.CPU), nil
}
