// Package nsinit is the first process inside a sandbox of the namespaces
// backend, pid 1 of its pid namespace: it builds the sandbox from the
// inside, in one ordered list of steps, starts the command with every
// protection applied, and reaps. It runs in the sandbox binary
// (cmd/airlock-sandbox), apart from the daemon's packages.
package nsinit

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Arg is the first argument of the sandbox binary started as a sandbox's
// init. main must call Main before anything else when it sees it.
const Arg = "__airlock-sandbox-init"

// Reports on StatusFD, one byte each, the last one followed by data.
const (
	StatusFailed  = 'E' // setup failed; the message follows
	StatusRunning = 'R' // the user's command started
	StatusExited  = 'X' // it ended; its wait status follows, 4 bytes little-endian
)

// File is a file the host places in the sandbox, read-only, under
// layout.CodeDir.
type File struct {
	Name string
	Data []byte
}

// Config is what the host tells init. It is trusted: it comes from the
// airlock process that started init, over an inherited pipe.
type Config struct {
	Argv      []string
	Env       []string
	Workdir   string
	Hostname  string
	RootDir   string // empty host directory to mount the new root on
	DiskBytes int64  // RLIMIT_FSIZE: the policy's disk limit
	// WritableBytes is the size of the root's tmpfs: policy.WritableBytes,
	// at most DiskBytes, so that a full tmpfs is ENOSPC before SIGXFSZ.
	WritableBytes  int64
	WritableInodes int64 // its nr_inodes: policy.WritableInodes
	Pids           int64
	Mounts         []policy.Mount
	Files          []File
	// Layers is how many image layers the host sends, on the layers'
	// socket (FDs.Layers), once this process's user namespace exists
	// (see layers.go); 0: the sandbox's root is the host's view.
	Layers int
	// Root: the command runs as the sandbox's root, with the capabilities
	// of rootCaps inside its user namespace (only for an image's root).
	Root bool
	// ExportRoot: once the writable layer is mounted, init sends the host
	// a descriptor of its directory on the layers' socket (layers.go).
	ExportRoot bool
	// Networked: init was started in a network namespace the host made
	// and configured (package netpolicy), loopback included, and owns
	// none of it; otherwise its namespace is new and has only loopback.
	Networked bool
	// TrustMount: the last of Mounts is the host's store of certificates
	// with the egress CA, mounted over the host's (layout.CABundle) in a
	// root that shares it. TrustPEM: the CA, added to an image's store.
	TrustMount bool
	TrustPEM   []byte
	// CgroupFiles is how many cgroup v1 "tasks" files the host opened
	// for init, and CommandFiles how many files it hands the command:
	// with Mounts and Layers they make the layout of init's descriptors
	// (FDs).
	CgroupFiles  int
	CommandFiles int
}

// Main is the sandbox's first process, pid 1 of its pid namespace. It
// builds the sandbox, starts the user's command with every protection
// applied, reaps orphans like any init, reports how the command ended on
// StatusFD, and exits: with pid 1 gone, the kernel kills whatever is left.
//
// The command is not exec'd as pid 1 itself: the kernel ignores signals
// that pid 1 has no handler for, so "kill -TERM $$" or a program's own
// raise(SIGSEGV) would silently do nothing, and orphans would turn into
// zombies under programs that never wait.
func Main() {
	// Per-thread properties set below (the bounding set, securebits, the
	// cgroups joined on v1, the cgroup namespace) must be those of the
	// thread that forks the command, so this goroutine keeps its thread.
	runtime.LockOSThread()
	// Executed through a descriptor, init would be called by its number
	// (the kernel names a process after its file): name it as ps expects.
	_ = os.WriteFile("/proc/self/comm", []byte("init"), 0)
	status := os.NewFile(StatusFD, "status")
	// Signals are caught from the start, not from the command's: one sent
	// while the sandbox is built would otherwise end init by its default
	// action (only signals from inside the pid namespace are ignored by
	// pid 1). What arrives meanwhile is passed on once the command runs.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	// One pending SIGCHLD is all reap needs to look again (see reap).
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	main, err := setup()
	if err != nil {
		status.Write(append([]byte{StatusFailed}, err.Error()...))
		os.Exit(1)
	}
	status.Write([]byte{StatusRunning})
	ws := reap(main, sigs, chld)
	var msg [5]byte
	msg[0] = StatusExited
	binary.LittleEndian.PutUint32(msg[1:], uint32(ws))
	status.Write(msg[:])
	os.Exit(0)
}

// setup is the ordered checklist of DESIGN.md. Each step depends on the
// ones before it. It returns the pid of the started command.
func setup() (int, error) {
	// 1. The config: what to run and how to build the sandbox.
	c, err := readConfig()
	if err != nil {
		return 0, err
	}
	fds := c.FDs()
	// Its own binary is open only to be executed, done: let it go.
	if err := unix.Close(fds.Self); err != nil {
		return 0, fmt.Errorf("close the sandbox binary: %w", err)
	}
	// 2. Enter the sandbox's cgroups before anything else, so all that
	// follows is limited and accounted.
	if err := joinCgroups(fds.Cgroups); err != nil {
		return 0, err
	}
	// A cgroup namespace rooted at the sandbox's cgroup, so that
	// /proc/self/cgroup shows "/" and nothing of the host.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return 0, fmt.Errorf("cgroup namespace: %w", err)
	}
	if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
		return 0, fmt.Errorf("sethostname: %w", err)
	}
	// 3. The root file system, then pivot into it: the host's view, or an
	// image's layers, which the host idmapped for this user namespace.
	// The idmapped mounts come after the layers, in c.Mounts' order.
	var layers, idMapped []int
	if fds.Layers >= 0 {
		trees, err := receiveLayers(fds.Layers, c.Layers+c.idMapped())
		if err != nil {
			return 0, err
		}
		layers, idMapped = trees[:c.Layers], trees[c.Layers:]
	}
	mounts := make([]int, 0, len(c.Mounts))
	plain := fds.Mounts
	for _, m := range c.Mounts {
		if m.IDMapped {
			mounts, idMapped = append(mounts, idMapped[0]), idMapped[1:]
		} else {
			mounts, plain = append(mounts, plain[0]), plain[1:]
		}
	}
	err = buildRoot(c.RootDir, c, mounts, layers, fds.Layers)
	if fds.Layers >= 0 {
		unix.Close(fds.Layers)
	}
	if err != nil {
		return 0, err
	}
	// 4. Network: a fresh namespace has only loopback, and it is down. A
	// host-made one is ready, and not ours to change.
	if !c.Networked {
		if err := loopbackUp(); err != nil {
			return 0, err
		}
	}
	// Resolve the command now, while errors can still be reported clearly.
	argv0, err := agentproto.LookPath(c.Argv[0], c.Env)
	if err != nil {
		return 0, err
	}
	// 5. Privileges: become uid/gid 1000 with no capabilities, then
	// no_new_privs, Landlock and rlimits, on every thread of init too.
	drop := dropPrivileges
	if c.Root {
		drop = keepRoot
	}
	if err := drop(); err != nil {
		return 0, err
	}
	if err := os.Chdir(c.Workdir); err != nil {
		return 0, fmt.Errorf("workdir %s: %w", c.Workdir, errors.Unwrap(err))
	}
	if err := llsyscall.AllThreadsPrctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return 0, fmt.Errorf("no_new_privs: %w", err)
	}
	if err := restrictLandlock(c); err != nil && !errors.Is(err, errNoLandlock) {
		return 0, err
	}
	if err := setRlimits(c); err != nil {
		return 0, err
	}
	// 6. seccomp last: it forbids syscalls the steps above needed.
	if err := installSeccomp(); err != nil {
		return 0, err
	}
	files := []uintptr{0, 1, 2}
	for _, fd := range fds.Command {
		files = append(files, uintptr(fd))
	}
	// Nothing but those files may reach the command: not the status pipe,
	// not whatever the host process inherited. ForkExec's dup2 clears
	// close-on-exec on exactly the files it hands over.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, fmt.Errorf("close-on-exec: %w", err)
	}
	pid, err := syscall.ForkExec(argv0, c.Argv, &syscall.ProcAttr{Env: c.Env, Files: files})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", c.Argv[0], err)
	}
	return pid, nil
}

// reap waits for children until main ends, and returns its wait status.
// It runs on the thread that forked main: Landlock gave each of init's
// threads a domain of its own (ABI 7 has no TSYNC), and its signal scope
// lets a thread signal only processes of its own domain, which main
// inherited from this thread alone; so the signals init receives are
// passed on from here. It reaps when SIGCHLD (chld) says a child ended,
// without blocking, rather than from a thread parked in wait4: an idle
// init keeps as few threads as Go allows, and a host's task limit, not
// its memory, bounds how many idle sandboxes it holds.
func reap(main int, sigs, chld <-chan os.Signal) unix.WaitStatus {
	for {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			switch {
			case err == unix.EINTR:
				continue
			case err != nil: // ECHILD: cannot happen before main is reaped
				return unix.WaitStatus(0xff00) // exit code 255
			case pid == main:
				return ws
			}
			if pid == 0 { // children left, none ended since the last look
				break
			}
		}
		// A child that ends from here on sends a SIGCHLD, which chld
		// holds until it is read: none is missed.
		select {
		case s := <-sigs:
			_ = unix.Kill(main, s.(unix.Signal))
		case <-chld:
		}
	}
}

// joinCgroups moves the calling thread, the one that will fork the
// command, into the sandbox's cgroups by writing "0" to their v1 "tasks"
// files. Moving a whole process through cgroup.procs takes a global lock
// that costs an RCU grace period (1-30 ms measured here); moving only the
// current thread does not. The files were opened by host root, which is
// what the kernel checks, and are closed here, before any user code runs.
// (On cgroup v2 init was cloned into its cgroup and there are no files.)
func joinCgroups(fds []int) error {
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "cgroup")
		_, err := f.Write([]byte("0"))
		f.Close()
		if err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	return nil
}

func readConfig() (*Config, error) {
	f := os.NewFile(ConfigFD, "config")
	data, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(data)
}

// ParseConfig decodes the config the host sent, as init reads it.
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	if len(c.Argv) == 0 {
		return nil, errors.New("no command")
	}
	// The counts make the layout of init's descriptors (FDs).
	if c.CgroupFiles < 0 || c.CommandFiles < 0 || c.Layers < 0 {
		return nil, errors.New("decode config: a negative count of files")
	}
	return &c, nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// IsInit reports whether this process was started as a sandbox init.
func IsInit() bool { return len(os.Args) > 1 && os.Args[1] == Arg }
