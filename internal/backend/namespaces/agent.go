package namespaces

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces/nsinit"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/ocilayer"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"golang.org/x/sys/unix"
)

// agentSandbox is a long-lived sandbox whose command is the airlock agent,
// reachable through a unix socket on the host that only root can open.
type agentSandbox struct {
	*Sandbox
	socket string
	// hostView: its root is one tmpfs (not an image's overlay), which
	// Lower resizes.
	hostView bool
	kept     bool // a keeper holds it: it outlives this process (adopt.go)
}

var (
	_ backend.Instance     = (*agentSandbox)(nil)
	_ backend.RootExporter = (*agentSandbox)(nil)
	_ backend.CodePlacer   = (*agentSandbox)(nil)
	_ backend.Lowerer      = (*agentSandbox)(nil)
)

// Start starts a sandbox running the agent. The daemon creates the
// listening socket and hands it to the agent as its fd 3, so the agent
// never needs a path of the host, and the sandbox's code never sees one.
// The agent's log (its stderr) goes to the backend's log.
func (b *Backend) Start(ctx context.Context, p policy.Policy, netns *os.File) (backend.Instance, error) {
	if err := b.prepareStateDir(); err != nil {
		return nil, err
	}
	dir := filepath.Join(b.stateDir, "agents")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	id, err := backend.NewBoxID()
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, id+".sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	// The socket file outlives this listener: the sandbox keeps its copy
	// of the listening socket, and the file is removed with the sandbox.
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	ln.Close()
	if err != nil {
		os.Remove(sock)
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	defer lf.Close()
	log := backend.LineLog(b.log)
	// The agent's reserve of tasks, above the user's pids limit: in the
	// cgroup and in its RLIMIT_NPROC.
	p.Pids += agentproto.AgentTasks
	sb, err := b.start(ctx, &spec{
		Spec: &backend.Spec{
			Policy: p,
			Argv:   []string{layout.AgentPath, agentproto.AgentArg},
			Stderr: log,
			Stdout: log,
			NetNS:  netns,
		},
		extraFiles: []*os.File{lf},
		selfMounts: selfMounts(p),
		trust:      b.trustOf(netns),
		id:         id,
		live:       true,
		oneLog:     true,
	})
	if err != nil {
		os.Remove(sock)
		return nil, err
	}
	s := &agentSandbox{Sandbox: sb, socket: sock, hostView: len(p.RootLayers) == 0}
	if err := s.keep(sb.logR, netns, p.OutputLimit); err != nil {
		s.Kill(ctx)
		s.Wait()
		return nil, fmt.Errorf("keeper: %w", err)
	}
	return s, nil
}

// selfMounts are where a sandbox of p has the airlock binary: its agent,
// and sudo where it has a root (an image's).
func selfMounts(p policy.Policy) []string {
	if p.Root {
		return []string{layout.AgentPath, layout.SudoPath}
	}
	return []string{layout.AgentPath}
}

// Dial connects to the agent.
func (s *agentSandbox) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", s.socket)
}

// Kill ends the sandbox; Wait removes it.
func (s *agentSandbox) Kill(context.Context) error {
	s.Sandbox.Kill()
	return nil
}

// Wait waits for the sandbox to end and removes all of it, its socket too.
func (s *agentSandbox) Wait() error {
	_, err := s.Sandbox.Wait()
	os.Remove(s.socket)
	return err
}

// Pause stops every process of the sandbox where it is (its cgroup's
// freezer), until Resume.
func (s *agentSandbox) Pause(ctx context.Context) error { return s.cg.Freeze(ctx, true) }

// ExportRoot writes the sandbox's writable layer as an image layer, the
// sandbox paused meanwhile so that what is read is one state of it.
func (s *agentSandbox) ExportRoot(ctx context.Context, w io.Writer) error {
	if s.upper == nil {
		return errors.New("the sandbox's root was not made to be exported")
	}
	// Reading a sandbox that runs is safe (WriteUpperLayer trusts nothing
	// of it); pausing it, where the host has a freezer, makes what is
	// read one state of it. Thawed whatever the freeze said: it may have
	// frozen the sandbox and then failed waiting.
	s.cg.Freeze(ctx, true)
	defer s.cg.Freeze(context.Background(), false)
	// dev, proc and sudo are the mount points of what init attached
	// there; /tmp is the sandbox's scratch space, left out of a layer as on
	// gVisor.
	return ocilayer.WriteUpperLayer(ctx, w, s.upper, s.HostUID-layout.UID, nsinit.MaxLayerEntries, []string{"dev", "proc", "tmp", layout.CodeDir[1:], layout.SudoPath[1:]})
}

// Resume restarts a paused sandbox.
func (s *agentSandbox) Resume(ctx context.Context) error { return s.cg.Freeze(ctx, false) }

// Usage is what the sandbox's cgroup has counted, and what its root's file
// system holds.
func (s *agentSandbox) Usage(context.Context) (backend.Usage, error) {
	st, err := s.cg.Stats()
	if err != nil {
		return backend.Usage{}, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	u := backend.Usage{Memory: st.Memory, Cache: st.Cache, CPU: st.CPU, MaxMemory: st.MaxMemory, OOMKills: st.OOMKills}
	u.Disk, err = s.diskUsed()
	u.DiskMeasured = err == nil
	return u, nil
}

// diskUsed is what the sandbox's writable file system holds: the tmpfs
// that is its root, or that an image root's overlay writes to (overlayfs
// reports its upper layer's). It is measured from the host, on init's
// root opened O_PATH (initRoot), where no path is followed: the daemon
// would otherwise ask each agent every few seconds, a wake-up of every
// idle sandbox and a connection held to each.
func (s *agentSandbox) diskUsed() (int64, error) {
	root, err := s.initRoot()
	if err != nil {
		return 0, err
	}
	defer unix.Close(root)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(root, &fs); err != nil {
		return 0, err
	}
	return int64(fs.Blocks-fs.Bfree) * fs.Bsize, nil
}

// initRoot opens the root of the sandbox's init, O_PATH. Init is reaped
// in the background, so its pid could be another process's by now: the
// root is opened by pid first, and init checked to be alive after,
// through its pidfd (initProc signals through one), which names init
// alone. Alive after the open, it was init's root that was opened.
func (s *agentSandbox) initRoot() (int, error) {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", s.proc.Pid()), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("sandbox root: %w", err)
	}
	if err := s.proc.Signal(0); err != nil {
		unix.Close(root)
		return -1, fmt.Errorf("sandbox init: %w", err)
	}
	return root, nil
}

// PlaceCode writes airlock run's code files into the sandbox's
// layout.CodeDir, as its init writes them into a sandbox built for the
// run: read-only, owned by the sandbox's root. The daemon is host root
// and the directory is the sandbox's, so nothing of it is followed: the
// root is init's (initRoot),
// CodeDir and each file are opened beneath it with no symlink or magic
// link resolved, and each file is created, never opened if it exists.
func (s *agentSandbox) PlaceCode(files []backend.File) error {
	if err := backend.CheckFileNames(files); err != nil {
		return err
	}
	root, err := s.initRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	beneath := uint64(unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS)
	dir, err := unix.Openat2(root, layout.CodeDir[1:], &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath})
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", layout.CodeDir, err)
	}
	defer unix.Close(dir)
	// Created as the sandbox's root (on the spawner thread, spawn.go):
	// the root's tmpfs belongs to the sandbox's user namespace, in which
	// host root has no id to own a file by (EOVERFLOW).
	return asOwner(s.HostUID-layout.UID, nil, func() error {
		for _, f := range files {
			if err := writeNew(dir, f, beneath); err != nil {
				return fmt.Errorf("code file %s: %w", f.Name, err)
			}
		}
		return nil
	})
}

// writeNew creates f beneath dir, read-only for all.
func writeNew(dir int, f backend.File, resolve uint64) error {
	fd, err := unix.Openat2(dir, f.Name, &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Mode:    0o444,
		Resolve: resolve,
	})
	if err != nil {
		return err
	}
	file := os.NewFile(uintptr(fd), f.Name)
	defer file.Close()
	if _, err := file.Write(f.Data); err != nil {
		return err
	}
	return file.Chmod(0o444) // whatever the daemon's umask
}

// Lower gives the sandbox p's lower limits: its cgroup's, with the
// agent's reserve of tasks as at its start, and its root tmpfs's size and
// inodes (the disk limit, bounded by memory), reconfigured through init's
// root (initRoot), which nothing of a client's has touched yet. An image's root (an overlay) is not resized: refused.
func (s *agentSandbox) Lower(p policy.Policy) error {
	if !s.hostView {
		return errors.New("the limits of a sandbox of an image cannot be lowered")
	}
	l := cgroups.Limits{MemoryBytes: p.MemoryBytes, Pids: p.Pids + agentproto.AgentTasks, CPUs: p.CPUs}
	if err := s.cg.Lower(l); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	root, err := s.initRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	fs, err := unix.Fspick(root, "", unix.FSPICK_EMPTY_PATH|unix.FSPICK_CLOEXEC|unix.FSPICK_SYMLINK_NOFOLLOW|unix.FSPICK_NO_AUTOMOUNT)
	if err != nil {
		return fmt.Errorf("sandbox root: %w", err)
	}
	defer unix.Close(fs)
	for _, kv := range [][2]string{
		{"size", strconv.FormatInt(p.WritableBytes(), 10)},
		{"nr_inodes", strconv.FormatInt(p.WritableInodes(), 10)},
	} {
		if err := unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
			return fmt.Errorf("sandbox root %s: %w", kv[0], err)
		}
	}
	if err := unix.FsconfigReconfigure(fs); err != nil {
		return fmt.Errorf("sandbox root: %w", err)
	}
	return nil
}
