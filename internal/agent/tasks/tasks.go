// Package tasks starts the agent's child processes with the sandbox's
// pids limit, keeping agentproto.AgentTasks tasks of it for the agent.
package tasks

import (
	"os/exec"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

var (
	// mu serializes starts: RLIMIT_NPROC is the whole process's, lowered
	// only while a child is forked.
	mu sync.Mutex
	// own is the agent's RLIMIT_NPROC as it started: the sandbox's pids
	// limit plus agentproto.AgentTasks.
	own = func() unix.Rlimit {
		var rl unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NPROC, &rl) != nil {
			rl.Cur = unix.RLIM_INFINITY
		}
		return rl
	}()
)

// Start starts cmd with the soft RLIMIT_NPROC lowered by
// agentproto.AgentTasks, so that the user's processes (each fork counted
// against the forker's limit, per user) leave the agent its reserve. The
// limit is lowered in the agent itself for the moment of the fork, which
// the child inherits before it runs an instruction of its own; a prlimit
// of the child after the start would leave it a window in which to fork.
// A thread the Go runtime starts meanwhile counts against the lower limit
// too, which matters only when the user's processes hold all of theirs.
// The hard limit stays, and code may raise its soft limit up to it, as it
// may kill the agent, which runs as the same user: the reserve keeps a
// sandbox alive through runaway code, and is no defence against code that
// means to end its own sandbox. Where the agent has no reserve (no limit,
// or one too small, as outside a sandbox), cmd starts as it is.
func Start(cmd *exec.Cmd) error { return StartWithin(cmd, Child{}) }

// Child is what a command started by StartWithin gets other than Start's:
// zero fields leave Start's.
type Child struct {
	// Nproc and FileSize lower its soft RLIMIT_NPROC and RLIMIT_FSIZE.
	Nproc, FileSize int64
	// Umask, if set, is its umask.
	Umask *uint32
}

// StartWithin is Start with c's lower soft limits and umask, for a
// command under lower limits than the sandbox's (airlock run's, in a
// pooled sandbox). They too are the agent's own for the moment of the
// fork only, under the lock every start takes: the child inherits them
// before it runs an instruction of its own. Only the soft limits are
// lowered: the command may raise them up to the sandbox's hard ones,
// its cgroup's pids limit and its file system's size the bounds.
func StartWithin(cmd *exec.Cmd, c Child) error {
	mu.Lock()
	defer mu.Unlock()
	if c.Umask != nil {
		old := unix.Umask(int(*c.Umask))
		defer unix.Umask(old)
	}
	nproc, fsize := c.Nproc, c.FileSize
	if fsize > 0 {
		var was unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &was); err != nil {
			return err
		}
		if uint64(fsize) < was.Cur {
			lower := unix.Rlimit{Cur: uint64(fsize), Max: was.Max}
			if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lower); err != nil {
				return err
			}
			// Back up to what it was: at most the hard limit, which
			// did not change.
			defer unix.Setrlimit(unix.RLIMIT_FSIZE, &was)
		}
	}
	if own.Cur == unix.RLIM_INFINITY || own.Cur <= 2*agentproto.AgentTasks {
		return cmd.Start()
	}
	lower := unix.Rlimit{Cur: own.Cur - agentproto.AgentTasks, Max: own.Max}
	if nproc > 0 && uint64(nproc) < lower.Cur {
		lower.Cur = uint64(nproc)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lower); err != nil {
		return err
	}
	err := cmd.Start()
	// Raising the soft limit back up to the hard one cannot fail.
	_ = unix.Setrlimit(unix.RLIMIT_NPROC, &own)
	return err
}
