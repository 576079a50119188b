package daemon

import (
	"log/slog"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// maxFiles caps the daemon's limit on open files: the kernel's own cap
// (fs.nr_open) is usually 1,048,576 as well.
const maxFiles = 1 << 20

// raiseFileLimit lifts the daemon's limit on open files as far as the
// kernel lets it. An idle sandbox holds about six descriptors in the
// daemon (its init's pidfd and pipes, its agent's connection, its run
// directory), more while clients talk to it: at a shell's 1,024 or a
// service manager's 20,000, a host of a few thousand idle sandboxes would
// fail its next create on EMFILE with memory and tasks to spare.
// Sandboxes do not inherit it: their init and gVisor's spec set 4,096.
// It only ever raises; one that cannot (not root) keeps what Go gave it
// at start, the soft limit raised to the hard one.
func raiseFileLimit(log *slog.Logger) {
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
		return
	}
	want := uint64(maxFiles)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n < want {
			want = n
		}
	}
	if cur.Cur >= want && cur.Max >= want {
		return
	}
	next := unix.Rlimit{Cur: max(cur.Cur, want), Max: max(cur.Max, want)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &next); err != nil {
		// Raising a hard limit takes CAP_SYS_RESOURCE.
		log.Info("the limit on open files stays; each idle sandbox takes three", "limit", cur.Cur, "err", err)
		return
	}
	log.Debug("raised the limit on open files", "from", cur.Cur, "to", next.Cur)
}
