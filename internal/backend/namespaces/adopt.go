package namespaces

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
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
	var n [8]byte
	rand.Read(n[:])
	path := filepath.Join(dir, hex.EncodeToString(n[:])+".sock")
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
	entries, err := os.ReadDir(b.keepersDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("keepers: %w", err)
	}
	spawners.mu.Lock()
	defer spawners.mu.Unlock()
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		path := filepath.Join(b.keepersDir(), e.Name())
		sp, err := b.reattach(path, all)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if sp == nil {
			continue
		}
		if spawners.keep != nil && spawners.current == nil && sp.exe == exeID() {
			spawners.current = sp
		} else {
			sp.send(spawnRequest{Kind: reqRetire}, nil)
		}
	}
	return errors.Join(errs...)
}

// reattach takes over the keeper listening at path; nil if there is none
// there any more.
func (b *Backend) reattach(path string, locks []*rangelock.Locks) (*spawner, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
			os.Remove(path) // a keeper that died
			return nil, nil
		}
		return nil, fmt.Errorf("keeper: %w", err)
	}
	sp := &spawner{sock: fd, procs: map[uint64]*spawnedInit{}, keeper: true}
	// The inventory, read here; what follows (reports of inits that
	// end) by sp.read.
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10})
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(maxSpawnFiles*4))
	var ids []string
	for {
		n, oobn, flags, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		var r spawnReport
		files, ferr := receivedFiles(oob[:max(oobn, 0)])
		switch {
		case err != nil || n == 0:
			err = fmt.Errorf("keeper %s: no inventory: %v", filepath.Base(path), err)
		case ferr != nil || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
			err = fmt.Errorf("keeper %s: a malformed message", filepath.Base(path))
		default:
			err = json.Unmarshal(buf[:n], &r)
		}
		if err != nil {
			closeAll(files)
			sp.died()
			return nil, err
		}
		if r.Inventory {
			sp.next, sp.exe = r.Next, r.Exe
			b.adoptLocks(r.Paths, files, locks)
			break
		}
		if id := b.takeKept(sp, &r, files); id != "" {
			ids = append(ids, id)
		}
	}
	// Their locks, through the descriptions just adopted, which hold them
	// already (taken through another, they would look busy), before any
	// cleanup could take them.
	b.mu.Lock()
	for _, id := range ids {
		b.runs.TryLock(runOffset(id))
		uidLocks.TryLock(int64((b.kept[id].info.HostUID - hostIDBase) / hostIDRange))
	}
	b.mu.Unlock()
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{})
	go sp.read()
	return sp, nil
}

// adoptLocks makes the lock descriptions a keeper holds this process's.
func (b *Backend) adoptLocks(paths []string, files []*os.File, locks []*rangelock.Locks) {
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
			// Another keeper's, handed over already: one description
			// per file, passed on from daemon to daemon (KeepAlive).
			f.Close()
			b.log.Warn("keeper's lock", "err", err)
		}
	}
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
	var info heldInfo
	if r.Tag == "" || json.Unmarshal(r.Info, &info) != nil || !validID(r.Tag) {
		// Forked, never set up (the daemon died in its start): its
		// cgroup and record are a leftover's (Cleanup).
		p.Signal(syscall.SIGKILL)
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

// validID reports whether id is one newID makes.
func validID(id string) bool {
	_, err := hex.DecodeString(id)
	return err == nil && len(id) == 16
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
		logR := k.held[0]
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
	fds := []int{int(logR.Fd())}
	if netns != nil {
		fds = append(fds, int(netns.Fd()))
	}
	if s.upper != nil {
		fds = append(fds, int(s.upper.Fd()))
	}
	if err := p.sp.send(spawnRequest{Kind: reqHold, ID: p.id, Tag: s.ID, Info: data}, fds); err != nil {
		return err
	}
	s.kept = true
	return nil
}
