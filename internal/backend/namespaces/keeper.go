package namespaces

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The spawner's own side: the process that forks inits for a daemon.
//
// A daemon with live restore (KeepAlive) makes its spawner a keeper: a
// process that outlives it. The keeper is not killed with the daemon (no
// parent-death signal, a session of its own) and, when the daemon's
// connection ends, keeps its inits (their parent-death signal is the
// keeper's) and the files it was told to hold with each (the agent's
// log pipe, whose writer would otherwise die of SIGPIPE; its network
// namespace; its writable layer) and the daemon's lock descriptions,
// through which every sandbox's host ids, record and network slot stay
// taken (rangelock). It then waits on a socket of its own in the
// daemon's state directory (<state dir>/keepers/<n>.sock, root's 0700)
// for the next daemon, which it tells what it holds (spawnReport's Kept
// and Inventory) and which takes it all back (adopt.go). A keeper with
// no init left and no daemon exits, removing its socket.
//
// Whoever connects must be root (its peer credentials are checked), and
// the socket is in a directory only root can reach: the keeper forks as
// root whatever it is asked.

// keeper is the spawner process's state.
type keeper struct {
	live bool   // a keeper: it outlives its daemon
	path string // its socket, removed when it exits

	mu      sync.Mutex
	conn    int // the daemon's connection; -1 while there is none
	inits   map[uint64]*keptInit
	locks   []*os.File
	paths   []string
	maxID   uint64
	retired bool
}

// keptInit is an init the spawner forked, with what it holds for it.
type keptInit struct {
	proc  childInit
	tag   string
	info  json.RawMessage
	held  []*os.File
	ended *spawnReport // it has ended, and no daemon has heard of it yet
}

// ServeSpawner serves the spawner's socket, descriptor 3, until the daemon
// closes it, and returns the process's exit code. With args (a keeper's:
// its socket's path), it then serves, one after the other, the daemons
// that connect to its listening socket, descriptor 4.
func ServeSpawner(args []string) int {
	const sock, listener = 3, 4
	k := &keeper{conn: sock, inits: map[uint64]*keptInit{}}
	if len(args) == 1 {
		k.live, k.path = true, args[0]
	}
	// Inits are forked from here: the sockets must not reach them, or a
	// sandbox could ask for forks as root. Go opens every other
	// descriptor close-on-exec.
	fds := []int{sock}
	if k.live {
		fds = append(fds, listener)
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			fmt.Fprintln(os.Stderr, "airlock spawner: socket:", err)
			return 1
		}
	}
	// The parent-death signal that ends the spawner with the daemon is
	// this thread's: the kernel clears it when a thread's credentials
	// change, as the spawner thread's do for each fork (asOwner). Keep
	// this goroutine on this thread, so that the spawner thread is
	// another. Should the daemon have died before, the socket's end says
	// so below.
	runtime.LockOSThread()
	// A terminal's ^C or a signal to the daemon's whole group is the
	// daemon's to handle (it ends its sandboxes in order): caught here,
	// not ignored, so that inits do not inherit the disposition. A
	// keeper's stderr may be a pipe its daemon read: once that daemon is
	// gone a write fails, rather than killing the keeper.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	conn := sock
	for {
		if code, done := k.serve(conn); done {
			return code
		}
		if !k.live {
			return 0 // the daemon is gone: so are its sandboxes
		}
		// No send may use the number once it is closed.
		k.mu.Lock()
		k.conn = -1
		unix.Close(conn)
		k.exitIfIdle()
		k.mu.Unlock()
		conn = accept(listener)
		k.mu.Lock()
		k.conn = conn
		k.inventory()
		k.mu.Unlock()
	}
}

// accept waits for the next daemon: a connection whose peer is root.
func accept(listener int) int {
	for {
		c, _, err := unix.Accept4(listener, unix.SOCK_CLOEXEC)
		switch err {
		case unix.EINTR, unix.ECONNABORTED:
			continue
		case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM:
			// Short of resources for a moment: its inits must not die
			// of it.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "airlock keeper: accept:", err)
			os.Exit(1) // its inits die with it: fail closed
		}
		cred, err := unix.GetsockoptUcred(c, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil || cred.Uid != 0 {
			unix.Close(c)
			continue
		}
		return c
	}
}

// serve answers conn's requests until it ends; done says the process is
// to exit with code.
func (k *keeper) serve(conn int) (code int, done bool) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(maxSpawnFiles*4))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(conn, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0, false // the daemon closed its end, or died
		}
		files, err := receivedFiles(oob[:oobn])
		var req spawnRequest
		if err == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			err = errors.New("message truncated")
		}
		if err == nil {
			err = json.Unmarshal(buf[:n], &req)
		}
		if err == nil && req.Files != len(files) {
			err = fmt.Errorf("%d files for a request of %d", len(files), req.Files)
		}
		if err != nil {
			// Cannot happen: the daemon is this program. Should it, the
			// daemon learns of it from the socket's end, and fails
			// every fork it waits for.
			fmt.Fprintln(os.Stderr, "airlock spawner: malformed request:", err)
			return 1, true
		}
		k.mu.Lock()
		k.maxID = max(k.maxID, req.ID)
		k.mu.Unlock()
		switch req.Kind {
		case "", reqExec:
			k.fork(&req, files)
		case reqHold:
			k.hold(&req, files)
		case reqLocks:
			k.mu.Lock()
			k.locks, k.paths = append(k.locks, files...), append(k.paths, req.Paths...)
			k.mu.Unlock()
		case reqRetire:
			closeAll(files)
			k.mu.Lock()
			k.retired = true
			k.exitIfIdle()
			k.mu.Unlock()
		default:
			closeAll(files)
			fmt.Fprintln(os.Stderr, "airlock spawner: unknown request", req.Kind)
			return 1, true
		}
	}
}

// fork forks req's init and reports it, then its end.
func (k *keeper) fork(req *spawnRequest, files []*os.File) {
	k.mu.Lock()
	retired := k.retired
	k.mu.Unlock()
	if retired {
		closeAll(files)
		k.send(spawnReport{ID: req.ID, Err: "the spawner is retired"}, nil)
		return
	}
	spawn := spawnFor
	if req.Kind == reqExec {
		spawn = spawnExec
	}
	proc, err := spawn(req, files)
	closeAll(files)
	if err != nil {
		k.send(spawnReport{ID: req.ID, Err: err.Error()}, nil)
		return
	}
	pidfd := dupPidfd(proc)
	if pidfd < 0 {
		// Without a pidfd the daemon could not signal init safely.
		proc.Signal(syscall.SIGKILL)
		proc.Wait()
		k.send(spawnReport{ID: req.ID, Err: "no pidfd for init"}, nil)
		return
	}
	k.mu.Lock()
	k.inits[req.ID] = &keptInit{proc: proc}
	k.mu.Unlock()
	k.send(spawnReport{ID: req.ID, Pid: proc.Pid()}, []int{pidfd})
	unix.Close(pidfd)
	go func() {
		status, cpu, err := proc.Wait()
		r := spawnReport{ID: req.ID, Exited: true, Status: uint32(status), CPU: int64(cpu)}
		if err != nil {
			r.Err = err.Error()
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		ki := k.inits[req.ID]
		closeAll(ki.held)
		ki.held = nil
		if k.sendLocked(r, nil) {
			delete(k.inits, req.ID)
		} else {
			ki.ended = &r // for the next daemon
		}
		k.exitIfIdle()
	}()
}

// hold keeps req's tag, info and files with its init, in place of what
// it held; an init that has ended holds nothing.
func (k *keeper) hold(req *spawnRequest, files []*os.File) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ki := k.inits[req.ID]
	if ki == nil || ki.ended != nil {
		closeAll(files)
		return
	}
	closeAll(ki.held)
	ki.tag, ki.info, ki.held = req.Tag, req.Info, files
}

// inventory tells a daemon that has just connected what the keeper
// holds; k.mu is held. What it has heard of an ended init is forgotten.
func (k *keeper) inventory() {
	for id, ki := range k.inits {
		r := spawnReport{ID: id, Kept: true, Pid: ki.proc.Pid(), Tag: ki.tag, Info: ki.info}
		var fds []int
		pidfd := -1
		if ki.ended != nil {
			r.Exited, r.Status, r.CPU = true, ki.ended.Status, ki.ended.CPU
		} else {
			if pidfd = dupPidfd(ki.proc); pidfd < 0 {
				continue // reaped this moment: its end is reported next
			}
			fds = append(fds, pidfd)
			for _, f := range ki.held {
				fds = append(fds, int(f.Fd()))
			}
		}
		sent := k.sendLocked(r, fds)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if !sent {
			return
		}
		if ki.ended != nil {
			delete(k.inits, id)
		}
	}
	var fds []int
	for _, f := range k.locks {
		fds = append(fds, int(f.Fd()))
	}
	k.sendLocked(spawnReport{Inventory: true, Next: k.maxID, Exe: exeID(), Paths: k.paths, Retired: k.retired}, fds)
}

// exitIfIdle ends a keeper that holds no init and that no daemon will
// ask for more: none is connected, or it is retired; k.mu is held.
func (k *keeper) exitIfIdle() {
	if !k.live || len(k.inits) > 0 || (k.conn >= 0 && !k.retired) {
		return
	}
	os.Remove(k.path)
	os.Exit(0)
}

// send sends r with fds to the daemon; false if none heard it.
func (k *keeper) send(r spawnReport, fds []int) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sendLocked(r, fds)
}

func (k *keeper) sendLocked(r spawnReport, fds []int) bool {
	if k.conn < 0 {
		return false
	}
	msg, _ := json.Marshal(r)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(k.conn, msg, oob, nil, unix.MSG_NOSIGNAL); err != nil {
		if !k.live {
			os.Exit(1) // the daemon is gone: so are its sandboxes
		}
		return false // the connection's end reaches serve
	}
	return true
}

// dupPidfd is a new pidfd of proc's process, -1 if it has none.
func dupPidfd(proc childInit) int {
	pidfd := -1
	proc.cmd.Process.WithHandle(func(fd uintptr) {
		pidfd, _ = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	})
	return pidfd
}

// exeID names this process's executable: a keeper of another build than
// its daemon's forks no more (adopt.go).
func exeID() string {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d:%d:%d", st.Dev, st.Ino, st.Size, st.Mtim.Nano())
}
