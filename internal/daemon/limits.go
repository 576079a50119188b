package daemon

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// maxFiles caps the daemon's limit on open files: the kernel's own cap
// (fs.nr_open) is usually 1,048,576 as well.
const maxFiles = 1 << 20

// raiseFileLimit lifts the daemon's limit on open files as far as the
// kernel lets it. An idle sandbox holds four descriptors in the daemon
// (its init's pidfd and pipes, its agent's connection), nine with a
// network, more while clients talk to it: at a shell's 1,024 or a
// service manager's 20,000, a host of a few thousand idle sandboxes would
// fail its next create on EMFILE with memory and tasks to spare.
// Sandboxes do not inherit it: their init and gVisor's spec set 4,096.
// It only ever raises; one that cannot (raising a hard limit takes
// CAP_SYS_RESOURCE) keeps what Go gave it at start, the soft limit raised
// to the hard one. It returns the limit it has.
func raiseFileLimit() uint64 {
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
		return 0
	}
	want := uint64(maxFiles)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n < want {
			want = n
		}
	}
	if cur.Cur >= want && cur.Max >= want {
		return cur.Cur
	}
	next := unix.Rlimit{Cur: max(cur.Cur, want), Max: max(cur.Max, want)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &next); err != nil {
		return cur.Cur
	}
	return next.Cur
}
