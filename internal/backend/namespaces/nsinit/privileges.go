package nsinit

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// Step 5 of setup: what the command may do, cut down for good before it
// runs. Capabilities, the user's identity, Landlock and rlimits.

// lastCap is the highest capability number the running kernel knows.
func lastCap() (int, error) {
	data, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	var n int
	if _, err := fmt.Sscanf(string(data), "%d", &n); err != nil {
		return 0, fmt.Errorf("parse cap_last_cap: %w", err)
	}
	return n, nil
}

// dropPrivileges turns the sandbox's root into the unprivileged user with
// no capability left in any set, for good. Securebits, the bounding set and
// capset act on the calling thread, which forks the command; setresuid acts
// on all threads, and on init's other threads the kernel's setuid fix-up
// clears the capabilities.
func dropPrivileges() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	// Lock securebits so that neither uid 0 nor setuid fix-ups can ever
	// hand capabilities back, and ambient capabilities cannot be raised.
	const secure = 1<<0 | 1<<1 | // SECBIT_NOROOT, _LOCKED
		1<<2 | 1<<3 | // SECBIT_NO_SETUID_FIXUP, _LOCKED
		1<<5 | // SECBIT_KEEP_CAPS_LOCKED
		1<<6 | 1<<7 // SECBIT_NO_CAP_AMBIENT_RAISE, _LOCKED
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secure, 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	// The bounding set limits what any later execve could grant.
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	// Groups before uid: changing groups needs the capability setuid drops.
	if err := syscall.Setgroups([]int{layout.GID}); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(layout.GID, layout.GID, layout.GID); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := syscall.Setresuid(layout.UID, layout.UID, layout.UID); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	// Changing uids cleared the parent-death signal: arm it again, then
	// make sure the parent did not die in between (its end of the status
	// pipe would be closed).
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("parent death signal: %w", err)
	}
	fds := []unix.PollFd{{Fd: StatusFD, Events: unix.POLLOUT}}
	if _, err := unix.Poll(fds, 0); err != nil || fds[0].Revents&unix.POLLERR != 0 {
		return errors.New("the host process is gone")
	}
	// With SECBIT_NO_SETUID_FIXUP set, setresuid left the capability sets
	// as they were: clear effective, permitted and inheritable explicitly.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// rootCaps are what the root of a sandbox of an image keeps, in its own
// user namespace only (on the host it is an unprivileged uid that owns
// nothing): those of a container runtime's default, less MKNOD and
// AUDIT_WRITE, which a user namespace cannot use.
var rootCaps = []uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER, unix.CAP_SETGID,
	unix.CAP_SETUID, unix.CAP_SETFCAP, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE, unix.CAP_NET_RAW,
	unix.CAP_SYS_CHROOT, unix.CAP_KILL,
}

// keepRoot is dropPrivileges for a sandbox whose command runs as its
// root: uid 0 of the sandbox's user namespace, every capability but
// rootCaps dropped from every set for good (the bounding set, then the
// others), none ambient, none to be raised. It may setuid to any of the
// sandbox's own ids (its user's, to run their commands), which drops the
// rest, as on any Linux box.
func keepRoot() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	keep := map[uintptr]bool{}
	var mask [2]uint32
	for _, c := range rootCaps {
		keep[c] = true
		mask[c/32] |= 1 << (c % 32)
	}
	const secure = 1<<6 | 1<<7 // SECBIT_NO_CAP_AMBIENT_RAISE, _LOCKED
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secure, 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	for c := 0; c <= last; c++ {
		if !keep[uintptr(c)] {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("drop capability %d from bounding set: %w", c, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if err := syscall.Setgroups([]int{0}); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{{Effective: mask[0], Permitted: mask[0]}, {Effective: mask[1], Permitted: mask[1]}}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// restrictLandlock confines file access to reading the sandbox's root and
// writing only its writable places, and scopes signals and abstract unix
// sockets to the sandbox. Network rights are left alone: the network
// namespace already decides what is reachable, and code interpreters talk
// to their kernels over loopback TCP.
func restrictLandlock(c *Config) error {
	if _, err := llsyscall.LandlockGetABIVersion(); err != nil {
		return errNoLandlock
	}
	cfg := landlock.Config{HandledAccessFS: landlock.V11.HandledAccessFS, Scoped: landlock.V11.Scoped}
	// BestEffort only drops rights the running kernel does not know yet;
	// Landlock itself is present (checked above), so it is enforced.
	cfg = cfg.BestEffort()
	rules := []landlock.Rule{
		landlock.RODirs("/"),
		landlock.RWDirs(writablePaths(c)...).WithRefer(),
		landlock.RWDirs("/dev/pts").WithIoctlDev(),
		landlock.RWFiles(writableDevices...).WithIoctlDev(),
	}
	fd, flags, err := cfg.NewRulesetFD(rules...)
	if err != nil {
		return fmt.Errorf("landlock ruleset: %w", err)
	}
	if fd < 0 {
		return errNoLandlock
	}
	defer unix.Close(fd)
	if err := llsyscall.AllThreadsLandlockRestrictSelf(fd, flags); err != nil {
		return fmt.Errorf("landlock restrict: %w", err)
	}
	return nil
}

// writablePaths are the directories Landlock lets the command write
// below: the sandbox's scratch places, or an image's whole root, and the
// read-write mounts.
func writablePaths(c *Config) []string {
	writable := []string{"/tmp", "/home/user", "/dev/shm"}
	if c.Layers > 0 {
		writable = []string{"/"} // an image's root is the sandbox's own, writable as on E2B
	}
	for _, m := range c.Mounts {
		if !m.ReadOnly {
			writable = append(writable, m.Target)
		}
	}
	return writable
}

// writableDevices are the device nodes the command may write, and use
// ioctls of (a terminal's).
var writableDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty"}

// rlimit is one resource limit of the command, hard and soft alike.
type rlimit struct {
	resource int
	value    uint64
	name     string
}

// rlimits are the command's resource limits under c.
func rlimits(c *Config) []rlimit {
	return []rlimit{
		{unix.RLIMIT_CORE, 0, "core"},
		{unix.RLIMIT_NOFILE, 4096, "nofile"},
		// RLIMIT_NPROC counts per user in this user namespace; the pids
		// cgroup is the real limit, this makes a fork bomb fail sooner.
		{unix.RLIMIT_NPROC, uint64(c.Pids), "nproc"},
		{unix.RLIMIT_FSIZE, uint64(c.DiskBytes), "fsize"},
		// No RLIMIT_AS: numpy and pandas reserve large address ranges;
		// memory is the cgroup's job.
	}
}

func setRlimits(c *Config) error {
	for _, l := range rlimits(c) {
		rl := unix.Rlimit{Cur: l.value, Max: l.value}
		if err := unix.Setrlimit(l.resource, &rl); err != nil {
			return fmt.Errorf("rlimit %s: %w", l.name, err)
		}
	}
	return nil
}
