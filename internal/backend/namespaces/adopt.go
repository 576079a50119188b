package namespaces

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/rangelock"
)

// Live restore: sandboxes that outlive the daemon (keeper.go) and are
// taken back by the next one. The daemon tells its keeper, for each
// agent sandbox once it runs, its id and what the next daemon needs of
// it (heldInfo) with the files to hold (heldFiles); the next daemon
// connects to every keeper of the state directory (Reattach), claims
// each kept sandbox's locks before any cleanup could take it for a
// leftover, and builds an instance of each that its manager asks for
// (Adopt); what none asked for is killed and removed (DropUnadopted).

var (
	_ backend.Adopter   = (*Backend)(nil)
	_ backend.Adoptable = (*agentSandbox)(nil)
	_ backend.Keeper    = (*Backend)(nil)
)

// heldInfo is what a keeper keeps of a sandbox beside its files.
type heldInfo struct {
	HostUID     int
	HostView    bool
	OutputLimit int64
	NetNS       bool // its files hold its network namespace
	Upper       bool // … and its writable layer
}

// The files held with a sandbox, in this order: its log's read end, then
// its network namespace (NetNS), then its writable layer (Upper).

// KeepAlive makes this backend's sandboxes outlive this process: their
// inits are forked by keepers (keeper.go) that hold, beyond the
// backend's own locks, locks (a network's slots, say). The process must
// fork through a spawner (ForkThroughSpawner); call it before any
// sandbox starts.
func (b *Backend) KeepAlive(locks ...*rangelock.Locks) {
	spawners.mu.Lock()
	defer spawners.mu.Unlock()
	spawners.keep = &keeping{dir: b.keepersDir(), locks: append([]*rangelock.Locks{b.runs, uidLocks}, locks...)}
}

func (b *Backend) keepersDir() string { return filepath.Join(b.stateDir, "keepers") }

// listenKeeper makes a keeper's listening socket in dir.
func listenKeeper(dir string) (*os.File, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("keeper: %w", err)
	}
	name, err := backend.NewBoxID()
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, name+".sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("keeper socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, "", fmt.Errorf("keeper socket: %w", err)
	}
	if err := unix.Listen(fd, 4); err != nil {
		unix.Close(fd)
		os.Remove(path)
		return nil, "", fmt.Errorf("keeper socket: %w", err)
	}
	return os.NewFile(uintptr(fd), path), path, nil
}

// kept is a sandbox a keeper holds, until Adopt takes it.
type kept struct {
	proc *spawnedInit
	info heldInfo
	raw  json.RawMessage // another backend's info (backend.Keeper)
	held []*os.File
}

// Reattach connects to the keepers that earlier processes of this state
// directory left, takes their lock descriptions as this process's
// (rangelock.Adopt: locks, as KeepAlive's) and claims the locks of each
// sandbox they hold, so that no cleanup takes them for leftovers. Call
// it before any lock of this process is taken. A keeper of this build
// forks this process's sandboxes from now on if it keeps them alive;
// any other is told to retire once its sandboxes end.
func (b *Backend) Reattach(locks ...*rangelock.Locks) error {
	all := append([]*rangelock.Locks{b.runs, uidLocks}, locks...)
	dir := b.keepersDir()
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return fmt.Errorf("keepers: %w", err)
	}
	// Whoever can put a socket here is trusted with the sandboxes: root's
	// alone, as the state directory is.
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return fmt.Errorf("keepers: %s must be a directory only root can enter", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("keepers: %w", err)
	}
	spawners.mu.Lock()
	defer spawners.mu.Unlock()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		sp, own, err := b.reattach(path, all)
		if errors.Is(err, errEarlyEnd) {
			// A keeper exits when it holds nothing and no daemon is
			// connected: it may have, with this connection queued.
			time.Sleep(100 * time.Millisecond)
			sp, own, err = b.reattach(path, all)
		}
		if err != nil {
			// Fail closed: the sandboxes of a keeper not taken back
			// would look like leftovers, their ids and slots free.
			return err
		}
		if sp == nil {
			continue
		}
		// A keeper of this build that holds the lock descriptions this
		// process now uses forks its sandboxes; any other retires.
		if spawners.keep != nil && spawners.current == nil && own && !sp.retired && sp.exe == exeID() {
			spawners.current = sp
		} else {
			sp.send(spawnRequest{Kind: reqRetire}, nil)
		}
	}
	return nil
}

// errEarlyEnd: a keeper ended the connection before its inventory.
var errEarlyEnd = errors.New("the keeper ended the connection")

// reattach takes over the keeper listening at path; nil if there is none
// there any more. own says whether this process adopted the keeper's own
// lock descriptions (adoptLocks).
func (b *Backend) reattach(path string, locks []*rangelock.Locks) (sp *spawner, own bool, err error) {
	// Not blocking: a keeper serving another daemon accepts nobody, and
	// its queue, once full, would hold this start.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, false, err
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
			os.Remove(path) // a keeper that died
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("keeper %s: %w (is another daemon running on this state directory?)", filepath.Base(path), err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, false, err
	}
	if cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED); err != nil || cred.Uid != 0 {
		unix.Close(fd)
		return nil, false, fmt.Errorf("keeper %s: not root's", filepath.Base(path))
	}
	sp = &spawner{sock: fd, procs: map[uint64]*spawnedInit{}, keeper: true}
	// The inventory, read here; what follows (reports of inits that
	// end) by sp.read.
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10})
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(maxSpawnFiles*4))
	var ids []string
	first := true
	defer func() {
		if err != nil {
			// Not ours to touch: left as they run, for a later start.
			b.mu.Lock()
			for _, id := range ids {
				delete(b.kept, id)
			}
			b.mu.Unlock()
		}
	}()
	for {
		n, oobn, flags, _, rerr := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if rerr == unix.EINTR {
			continue
		}
		var r spawnReport
		files, ferr := receivedFiles(oob[:max(oobn, 0)])
		switch {
		case first && (n == 0 || errors.Is(rerr, unix.ECONNRESET)):
			err = errEarlyEnd
		case rerr != nil || n == 0:
			err = fmt.Errorf("keeper %s: no inventory (is another daemon running on this state directory?): %v", filepath.Base(path), rerr)
		case ferr != nil || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
			err = fmt.Errorf("keeper %s: a malformed message", filepath.Base(path))
		default:
			err = json.Unmarshal(buf[:n], &r)
		}
		if err != nil {
			closeAll(files)
			sp.died()
			return nil, false, err
		}
		first = false
		if r.Inventory {
			sp.next, sp.exe, sp.retired = r.Next, r.Exe, r.Retired
			own = b.adoptLocks(r.Paths, files, locks)
			break
		}
		if id := b.takeKept(sp, &r, files); id != "" {
			ids = append(ids, id)
		}
	}
	// Their locks, through the descriptions adopted, which hold them
	// already (taken through another, they would look busy), before any
	// cleanup could take them for leftovers'.
	b.mu.Lock()
	for _, id := range ids {
		if e := b.runs.TryLock(runOffset(id)); e != nil {
			err = errors.Join(err, fmt.Errorf("sandbox %s: its record's lock: %w", id, e))
		}
		if e := uidLocks.TryLock(int64((b.kept[id].info.HostUID - hostIDBase) / hostIDRange)); e != nil {
			err = errors.Join(err, fmt.Errorf("sandbox %s: its host ids' lock: %w", id, e))
		}
	}
	b.mu.Unlock()
	if err != nil {
		sp.died()
		return nil, false, fmt.Errorf("keeper %s: %w", filepath.Base(path), err)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{})
	go sp.read()
	return sp, own, nil
}

// adoptLocks makes the lock descriptions a keeper holds this process's.
// It reports whether every one of locks is now one of the keeper's: a
// description another keeper handed over first is kept instead (one
// description per file, passed on from daemon to daemon: KeepAlive).
func (b *Backend) adoptLocks(paths []string, files []*os.File, locks []*rangelock.Locks) bool {
	adopted := 0
	for i, f := range files {
		var l *rangelock.Locks
		for _, c := range locks {
			if i < len(paths) && c.Path == paths[i] {
				l = c
			}
		}
		if l == nil {
			f.Close()
			continue
		}
		if err := l.Adopt(f); err != nil {
			f.Close()
			continue
		}
		adopted++
	}
	return adopted == len(locks)
}

// takeKept takes one sandbox of a keeper's inventory: its init, which
// the keeper reports the end of to sp from now on, and its files. It
// returns the sandbox's id, "" for none to adopt.
func (b *Backend) takeKept(sp *spawner, r *spawnReport, files []*os.File) string {
	if r.Exited || len(files) == 0 {
		closeAll(files) // ended while no daemon ran: a leftover (Cleanup)
		return ""
	}
	p := &spawnedInit{sp: sp, id: r.ID, pid: r.Pid, pidfd: files[0], started: make(chan spawnReport, 1), ended: make(chan spawnReport, 1)}
	sp.procs[r.ID] = p
	if strings.Contains(r.Tag, "/") {
		// Another backend's process (backend.Keeper), for its TakeKept.
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.others == nil {
			b.others = map[string]*kept{}
		}
		b.others[r.Tag] = &kept{proc: p, raw: r.Info, held: files[1:]}
		return ""
	}
	var info heldInfo
	if r.Tag == "" || json.Unmarshal(r.Info, &info) != nil || !backend.IsBoxID(r.Tag) {
		// Forked, never set up (the daemon died in its start): its
		// cgroup and record are a leftover's (Cleanup).
		p.Signal(syscall.SIGKILL)
		go p.Wait()
		closeAll(files[1:])
		return ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kept == nil {
		b.kept = map[string]*kept{}
	}
	b.kept[r.Tag] = &kept{proc: p, info: info, held: files[1:]}
	return r.Tag
}

// Adopt takes back the sandbox handle (its id) that a keeper holds:
// its agent is reached again through its socket, its log through the
// pipe the keeper held, and netns is its network namespace, if it has
// one.
func (b *Backend) Adopt(_ context.Context, handle string) (backend.Instance, *os.File, error) {
	b.mu.Lock()
	k := b.kept[handle]
	delete(b.kept, handle)
	b.mu.Unlock()
	if k == nil {
		return nil, nil, fmt.Errorf("no running sandbox %s was kept", handle)
	}
	sb, netns, err := b.adopted(handle, k)
	if err != nil {
		return nil, nil, err
	}
	return &agentSandbox{Sandbox: sb, socket: filepath.Join(b.stateDir, "agents", handle+".sock"), hostView: k.info.HostView, kept: true}, netns, nil
}

// adopted is the Sandbox of what k holds, and its network namespace.
func (b *Backend) adopted(id string, k *kept) (*Sandbox, *os.File, error) {
	want := 1
	if k.info.NetNS {
		want++
	}
	if k.info.Upper {
		want++
	}
	slot := int64((k.info.HostUID - hostIDBase) / hostIDRange)
	sb := &Sandbox{
		ID: id, HostUID: k.info.HostUID, proc: k.proc, cg: cgroups.Load(cgroups.Prefix + id),
		lock:       &runLock{locks: b.runs, path: filepath.Join(b.stateDir, "runs", id), off: runOffset(id)},
		releaseIDs: func() { uidLocks.Unlock(slot) },
		started:    time.Now(), done: make(chan struct{}), exited: make(chan unix.WaitStatus),
	}
	close(sb.exited) // how the agent ended is init's death: no report
	log := backend.LineLog(b.log)
	sb.stdout = backend.NewCappedWriter(log, k.info.OutputLimit)
	sb.stderr = sb.stdout
	var netns *os.File
	if len(k.held) == want {
		logR := backend.Pollable(k.held[0])
		if k.info.NetNS {
			netns = k.held[1]
		}
		if k.info.Upper {
			sb.upper = k.held[want-1]
		}
		go func() { io.Copy(sb.stdout, logR); logR.Close() }()
	} else {
		closeAll(k.held)
	}
	go func() {
		sb.status, sb.cpu, sb.waitErr = sb.proc.Wait()
		close(sb.done)
	}()
	if len(k.held) != want {
		sb.Kill()
		sb.Wait()
		return nil, nil, fmt.Errorf("sandbox %s: its keeper held %d files, not %d", id, len(k.held), want)
	}
	return sb, netns, nil
}

// DropUnadopted kills and removes the kept sandboxes that no Adopt took:
// a pool's, one whose record was lost.
func (b *Backend) DropUnadopted() {
	b.mu.Lock()
	left := b.kept
	b.kept = nil
	b.mu.Unlock()
	for id, k := range left {
		b.log.Info("a kept sandbox no one adopted is removed", "sandbox", id)
		if sb, netns, err := b.adopted(id, k); err == nil {
			sb.Kill()
			sb.Wait()
			os.Remove(filepath.Join(b.stateDir, "agents", id+".sock"))
			if netns != nil {
				netns.Close()
			}
		}
	}
}

// Handle names the sandbox for a later process's Adopt; "" if it dies
// with this process (no keeper holds it).
func (s *agentSandbox) Handle() string {
	if !s.kept {
		return ""
	}
	return s.ID
}

// keep tells s's keeper, if it has one, what to hold of it: see
// heldInfo.
func (s *agentSandbox) keep(logR, netns *os.File, outputLimit int64) error {
	p, ok := s.proc.(*spawnedInit)
	if !ok || !p.sp.keeper {
		return nil
	}
	info := heldInfo{HostUID: s.HostUID, HostView: s.hostView, OutputLimit: outputLimit, NetNS: netns != nil, Upper: s.upper != nil}
	data, _ := json.Marshal(info)
	files := []*os.File{logR}
	if netns != nil {
		files = append(files, netns)
	}
	if s.upper != nil {
		files = append(files, s.upper)
	}
	if err := p.hold(s.ID, data, files); err != nil {
		return err
	}
	s.kept = true
	return nil
}

// StartKept starts cmd through this process's keeper (KeepAlive), for
// another backend whose processes outlive this one too.
func (b *Backend) StartKept(cmd *exec.Cmd) (backend.KeptProcess, error) {
	spawners.mu.Lock()
	keep := spawners.keep
	spawners.mu.Unlock()
	if keep == nil {
		return nil, errors.New("no keeper: this process keeps nothing alive")
	}
	out, ok1 := cmd.Stdout.(*os.File)
	errs, ok2 := cmd.Stderr.(*os.File)
	if !ok1 || !ok2 || cmd.Stdin != nil || len(cmd.Args) == 0 {
		return nil, errors.New("a kept process's output must be files, and it has no input")
	}
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	// The keeper's working directory is not this process's.
	path, err := filepath.Abs(cmd.Path)
	if err != nil {
		return nil, err
	}
	fds := []int{backend.RawFd(out), backend.RawFd(errs)}
	for _, f := range cmd.ExtraFiles {
		fds = append(fds, backend.RawFd(f))
	}
	sp, err := spawners.spawner()
	if err != nil {
		return nil, err
	}
	p, err := sp.start(spawnRequest{Kind: reqExec, Argv: append([]string{path}, cmd.Args[1:]...), Env: cmd.Env}, fds)
	if err != nil {
		return nil, err
	}
	return keptProc{p}, nil
}

// TakeKept returns what a keeper holds under tag for another backend.
func (b *Backend) TakeKept(tag string) (backend.KeptProcess, []byte, []*os.File) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.others[tag]
	if k == nil {
		return nil, nil, nil
	}
	delete(b.others, tag)
	return keptProc{k.proc}, k.raw, k.held
}

// KeptTags lists the tags of other backends' processes not yet taken.
func (b *Backend) KeptTags(prefix string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var tags []string
	for t := range b.others {
		if strings.HasPrefix(t, prefix) {
			tags = append(tags, t)
		}
	}
	return tags
}

// keptProc is a spawned process as another backend sees it.
type keptProc struct{ *spawnedInit }

func (p keptProc) Wait() { p.spawnedInit.Wait() }

func (p keptProc) Keep(tag string, info []byte, files []*os.File) error {
	return p.hold(tag, info, files)
}

// hold has p's keeper hold tag, info and files beside it.
func (p *spawnedInit) hold(tag string, info []byte, files []*os.File) error {
	if !p.sp.keeper {
		return errors.New("its spawner keeps nothing alive")
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = backend.RawFd(f)
	}
	return p.sp.send(spawnRequest{Kind: reqHold, ID: p.id, Tag: tag, Info: info}, fds)
}
