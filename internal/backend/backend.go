// Package backend is the contract between Airlock's sandbox manager and its
// isolation backends: what to run (Spec), what came of it (Result), and the
// Backend and Instance interfaces that each backend implements.
//
// A backend only builds an isolated box and hands back a connection to the
// agent inside it. Commands, files and the code interpreter then travel the
// agent's protocol (package agentproto) on every backend alike, so that a
// backend has only isolation to get right.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Backend builds sandboxes of one kind of isolation.
type Backend interface {
	// Name is the backend's name in configuration: "namespaces", "gvisor".
	Name() string
	// Check reports whether this backend can build sandboxes here and
	// run spec, without starting anything. Its errors are for the user.
	Check(spec *Spec) error
	// Run executes spec in a new sandbox under its policy's timeout and
	// removes the sandbox before returning. A canceled ctx kills the
	// sandbox like a timeout, but is reported as ctx.Err().
	Run(ctx context.Context, spec *Spec) (*Result, error)
	// Start starts a long-lived sandbox under p with the agent running
	// inside, in netns (see Spec.NetNS). It returns once the box exists;
	// the agent may still be starting (Instance.Dial waits for it).
	Start(ctx context.Context, p policy.Policy, netns *os.File) (Instance, error)
	// Cleanup removes what sandboxes of earlier, dead processes left
	// behind. Live sandboxes, of this process or another, are untouched.
	Cleanup(ctx context.Context) error
}

// Instance is one box a Backend started.
type Instance interface {
	// Dial opens a connection to the agent inside.
	Dial(ctx context.Context) (net.Conn, error)
	// Done is closed when the box has ended, whatever the reason.
	Done() <-chan struct{}
	// Kill ends the box without waiting; a paused box dies too.
	Kill(ctx context.Context) error
	// Wait waits until the box has ended and removes what is left of it.
	// Like exec.Cmd.Wait it takes no context: once the box is dying, its
	// removal must finish, or something of it would leak.
	Wait() error
	// Usage measures what the box uses now, its runtime's own share
	// (gVisor's kernel) included.
	Usage(ctx context.Context) (Usage, error)
	// Pause stops every process of the box where it is; Resume restarts
	// them. Kill works on a paused box.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Checkpointer is an Instance that can save itself whole (its memory,
// processes and files) to the backend's state directory and end, freeing
// its memory, to be brought back by its Backend's Restorer, in this
// process or a later one, after a reboot too.
type Checkpointer interface {
	// Checkpoint saves the box and ends it; its agent must have let go
	// of the host's socket first (agentproto.CheckpointPath).
	// It returns the name the Restorer knows the saved box by. On error
	// the box runs on, its agent told to listen again.
	Checkpoint(ctx context.Context) (string, error)
}

// Restorer is a Backend that brings back the boxes its Checkpointers
// saved.
type Restorer interface {
	// Restore starts the box saved as name, under p (the policy it was
	// started with), in netns where p has a network (as Start), and
	// tells its agent to listen again. The restored box's interface and
	// addresses are netns's, not those it was saved with: its open
	// connections end. The saved box stays until Forget: a restore that
	// fails can be tried again.
	Restore(ctx context.Context, name string, p policy.Policy, netns *os.File) (Instance, error)
	// Forget removes the saved box name.
	Forget(name string) error
	// Saved lists the names of the saved boxes.
	Saved() ([]string, error)
}

// Committer is an Instance a Restorer brought back that keeps its saved
// state until Commit: a restore its caller does not take (its agent did
// not answer, its daemon died) leaves the state for another try.
type Committer interface {
	// Commit removes the saved state the instance was restored from.
	Commit()
}

// Snapshotter is an Instance that can save a copy of itself whole (its
// memory, processes and files) into a directory while it runs on, for a
// Cloner to start copies of: E2B's fork and snapshots.
type Snapshotter interface {
	// Snapshot writes the copy into dir, which must not exist yet; its
	// agent must have let go of the host's socket first, as for a
	// Checkpoint, and is told to listen again however it ends.
	Snapshot(ctx context.Context, dir string) error
}

// Cloner is a Backend that starts boxes from its Snapshotters' copies.
type Cloner interface {
	// Clone starts a new box from the copy in dir, under p (the policy
	// of the box it is a copy of), in netns where p has a network (as
	// Restore: the copy's interface and addresses are netns's), and
	// tells its agent to listen again. A copy of another runtime's
	// version, or a corrupt one, is an error that says so; dir is only
	// read.
	Clone(ctx context.Context, dir string, p policy.Policy, netns *os.File) (Instance, error)
}

// Adoptable is an Instance that can outlive the process that started it
// (live restore), to be taken back by its Backend's Adopt in a later one.
type Adoptable interface {
	// Handle names the box for Adopt.
	Handle() string
}

// Adopter is a Backend whose boxes can outlive the process that started
// them: a daemon that stops, is killed or is replaced by a new binary
// leaves them running, and the next one takes them back.
type Adopter interface {
	// Adopt takes back the running (or paused) box that handle names,
	// started by an earlier process. netns is its network namespace if
	// it has one, the caller's to close: the box runs in it still.
	Adopt(ctx context.Context, handle string) (inst Instance, netns *os.File, err error)
	// DropUnadopted kills and removes the boxes an earlier process left
	// that no Adopt took. Call it once every box to adopt is.
	DropUnadopted()
}

// Keeper starts host processes that outlive the process that started
// them, and hands them, with what it kept beside them, to a later one
// (live restore): the namespaces backend's keeper serves the gVisor
// backend's runsc too.
type Keeper interface {
	// StartKept starts cmd (its Path, Args, Env, Stdout and Stderr,
	// which must be files, and ExtraFiles) as the keeper's child, in a
	// session of its own, killed if the keeper dies.
	StartKept(cmd *exec.Cmd) (KeptProcess, error)
	// TakeKept returns the process an earlier process kept under tag,
	// with the info and files it kept beside it; nil if there is none.
	TakeKept(tag string) (KeptProcess, []byte, []*os.File)
	// KeptTags lists the tags beginning with prefix that no TakeKept
	// has taken.
	KeptTags(prefix string) []string
}

// KeptProcess is a process a Keeper started.
type KeptProcess interface {
	Pid() int
	// Signal signals it through a pidfd, never by a pid another process
	// may have by now.
	Signal(sig syscall.Signal) error
	// Wait waits for it to end.
	Wait()
	// Keep has the keeper hold tag, info and files beside the process,
	// for a later process's TakeKept.
	Keep(tag string, info []byte, files []*os.File) error
}

// StateError is saved state (a checkpoint, a snapshot) that a backend
// refuses to restore. Reason completes "the saved state …" in words fit
// for clients: no host paths.
type StateError struct{ Reason string }

func (e *StateError) Error() string { return "the saved state " + e.Reason }

// RootExporter is an Instance whose writable root layer (policy
// ExportRoot) the host can read back.
type RootExporter interface {
	// ExportRoot writes what the box changed of its image's root as an
	// OCI layer (an uncompressed tar with whiteouts) to w. The box is
	// paused meanwhile, where the host can pause it, and resumed after.
	ExportRoot(ctx context.Context, w io.Writer) error
}

// Lowerer is an Instance whose limits can be lowered while it runs: a
// pooled box handed out under a request's lower limits.
type Lowerer interface {
	// Lower applies p's memory, CPU, pids and disk limits, none above
	// the box's own; on error the box must be discarded.
	Lower(p policy.Policy) error
}

// CodePlacer is an Instance that can take airlock run's code files
// (Spec.Files) into its layout.CodeDir, read-only and owned by its root,
// as a box built for the run has them: a run in a pooled box.
type CodePlacer interface {
	// PlaceCode writes files; none may exist there yet. The caller
	// checked their names (CheckFileNames) and that nothing of its own
	// has run in the box.
	PlaceCode(files []File) error
}

// CheckFileNames refuses a code file whose name is not a single path
// element.
func CheckFileNames(files []File) error {
	for _, f := range files {
		if f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, "/\x00") {
			return fmt.Errorf("file name %q is not a single path element", f.Name)
		}
	}
	return nil
}

// Usage is what a box uses.
type Usage struct {
	Memory int64         // bytes in use now
	Cache  int64         // of Memory, the page cache of files
	CPU    time.Duration // CPU time used so far
	// MaxMemory is the most it used at once since it started; OOMKills
	// counts the processes the memory limit killed. Zero where the host
	// cannot say.
	MaxMemory int64
	OOMKills  uint64
	// Disk is what the box's writable file systems hold, in bytes, where
	// the host measures it (DiskMeasured); where it does not, the daemon
	// asks the box's agent.
	Disk         int64
	DiskMeasured bool
}

// Spec is one execution: what to run, under which policy, with which I/O.
type Spec struct {
	Policy policy.Policy
	Argv   []string
	Files  []File    // written read-only into layout.CodeDir before the command starts
	Stdin  io.Reader // nil: /dev/null
	Stdout io.Writer // receives at most Policy.OutputLimit bytes
	Stderr io.Writer // likewise
	// NetNS is the network namespace the sandbox runs in, made by package
	// netpolicy for a policy with a network; nil: a new one with loopback
	// only. The backend neither configures nor closes it.
	NetNS *os.File
}

// File is a file the host places in the sandbox's layout.CodeDir.
type File struct {
	Name string
	Data []byte
}

// Result is what happened to the command. A non-zero exit, a signal, a
// timeout or an OOM kill is a result, not an error.
type Result struct {
	ExitCode        int    // -1 when killed by a signal
	Signal          string // e.g. "SIGKILL", empty when it exited
	TimedOut        bool
	OOMKilled       bool
	StdoutTruncated bool
	StderrTruncated bool
	Duration        time.Duration
	CPU             time.Duration
	MaxMemoryBytes  int64
}

// ErrUnsupported: the backend cannot build what the policy asks for; the
// message says what. It is the request's doing, not a failure.
var ErrUnsupported = errors.New("not supported by this backend")

// SetupTimeout bounds how long building a sandbox may take, from its
// cgroup's creation to its first process running: a cleanup may take an
// empty sandbox cgroup older than twice this for an orphan.
const SetupTimeout = 30 * time.Second

// SetupError means the sandbox could not be built, so nothing ran. Its
// message names what failed; it does not come from user code.
type SetupError struct{ Msg string }

func (e *SetupError) Error() string { return "sandbox setup failed: " + e.Msg }

// CheckNetNS checks, as a sandbox starts, that it has a network namespace
// made for it exactly when its policy has a network.
func CheckNetNS(p *policy.Policy, netns *os.File) error {
	if (netns != nil) != (p.Network.Mode != policy.NetNone) {
		return errors.New("a sandbox has a network namespace of its own exactly when its policy has a network")
	}
	return nil
}

// CheckSpec checks what every backend requires of a spec.
func CheckSpec(spec *Spec) error {
	if err := spec.Policy.Validate(); err != nil {
		return err
	}
	if len(spec.Argv) == 0 {
		return errors.New("no command to run")
	}
	if err := CheckFileNames(spec.Files); err != nil {
		return err
	}
	for _, m := range spec.Policy.Mounts {
		f, err := OpenMountSource(m.Source)
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}
