package sandbox

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// The room a host keeps for itself. An idle sandbox holds 13 (namespaces)
// to 37 (gVisor) host tasks: on a host whose kernel allows 32,768, some
// 2,400 or 900 sandboxes leave no process on the host able to fork,
// sshd's and the daemon's included, long before their memory runs out.
const (
	hostTaskShare = 0.9       // of the kernel's limit (pid_max, threads-max)
	hostMemFloor  = 512 << 20 // MemAvailable, in bytes
	// Of the daemon's limit on open files: an idle sandbox holds four
	// (nine with a network), and a create that meets the limit fails
	// midway, where one refused before it starts can be retried.
	fileShare = 0.9
)

// hostRoom reports whether the host has room for another sandbox: its
// tasks below hostTaskShare of what the kernel allows, hostMemFloor of
// memory available, and this process's open files below fileShare of its
// limit. What cannot be read does not refuse (a host without
// /proc/loadavg has other limits). The figures go to the log, not to
// clients.
func hostRoom() error {
	tasks, limit := hostTasks()
	if limit > 0 && float64(tasks) >= hostTaskShare*float64(limit) {
		return &PublicError{Err: ErrHostFull, Cause: fmt.Errorf("%d tasks of the %d the kernel allows", tasks, limit)}
	}
	if mem, ok := memAvailable(); ok && mem < hostMemFloor {
		return &PublicError{Err: ErrHostFull, Cause: fmt.Errorf("%d MiB of memory available", mem>>20)}
	}
	if used, limit := openFiles(); limit > 0 && float64(used) >= fileShare*float64(limit) {
		return &PublicError{Err: ErrHostFull, Cause: fmt.Errorf("%d of the %d open files this process may hold", used, limit)}
	}
	return nil
}

// openFiles estimates how many descriptors this process holds by the
// lowest free one, which the kernel hands out first: all below it are
// taken. One open and close, where counting /proc/self/fd would read
// thousands of entries on every create. Holes left by closed descriptors
// make it an underestimate until new ones fill them.
func openFiles() (used, limit int64) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > math.MaxInt64 {
		return 0, 0
	}
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.EMFILE:
		return int64(rl.Cur), int64(rl.Cur)
	case err != nil:
		return 0, 0
	}
	unix.Close(fd)
	return int64(fd), int64(rl.Cur)
}

// hostTasks returns the host's tasks (processes and threads) and the
// kernel's limit on them, 0 where unknown.
func hostTasks() (tasks, limit int64) {
	// loadavg's fourth field is "running/total" tasks.
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := bytes.Fields(b); len(f) >= 4 {
			if _, total, ok := bytes.Cut(f[3], []byte("/")); ok {
				tasks, _ = strconv.ParseInt(string(total), 10, 64)
			}
		}
	}
	for _, f := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		if b, err := os.ReadFile(f); err == nil {
			if n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil && n > 0 && (limit == 0 || n < limit) {
				limit = n
			}
		}
	}
	return tasks, limit
}

// memAvailable is /proc/meminfo's MemAvailable, in bytes.
func memAvailable() (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("MemAvailable:")); ok {
			f := bytes.Fields(rest)
			if len(f) == 2 && string(f[1]) == "kB" {
				if n, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
					return n << 10, true
				}
			}
		}
	}
	return 0, false
}

// hostRoom reports whether the host has room for another box.
func (m *Manager) hostRoom() error {
	if m.cfg.HostRoom != nil {
		return m.cfg.HostRoom()
	}
	return hostRoom()
}
