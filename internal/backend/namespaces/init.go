package namespaces

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces/nsinit"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandboxbin"
)

// The host's side of a sandbox's init (package nsinit): what it is told,
// the process it is forked as, the files it is handed, and its reports.

// start forks init for spec, hands it its config and files, and returns
// once init reports that the command runs, or with an error once init is
// dead.
func (s *Sandbox) start(ctx context.Context, spec *spec, bin *sandboxbin.Binary) error {
	base := s.HostUID - layout.UID
	p := &spec.Policy
	cfg := initConfig(spec, bin)
	cmd := initCmd(base, spec.NetNS)
	h, err := s.handOver(spec, &cfg, cmd, bin)
	if err != nil {
		return err
	}
	defer h.closeHost()
	cfgData, err := json.Marshal(&cfg)
	if err != nil {
		h.closeInit()
		h.statusR.Close()
		return err
	}
	s.stdout = backend.NewCappedWriter(spec.Stdout, p.OutputLimit)
	s.stderr = s.stdout // os/exec gives one writer one pipe
	if !spec.oneLog {
		s.stderr = backend.NewCappedWriter(spec.Stderr, p.OutputLimit)
	}
	cmd.Stdout, cmd.Stderr = s.stdout, s.stderr
	if spec.Stdin != nil {
		// Hide the *os.File behind a plain Reader so os/exec copies
		// through a pipe: a terminal must never be handed to the sandbox.
		cmd.Stdin = struct{ io.Reader }{spec.Stdin}
	}
	// Stdin copying may block on a terminal forever; output pipes close
	// when the sandbox dies. Bound both.
	cmd.WaitDelay = time.Second

	// Fork on the spawner thread, as the namespace's owner (spawn.go).
	err = asOwner(base, spec.NetNS, cmd.Start)
	h.closeInit()
	if err != nil {
		h.statusR.Close()
		return fmt.Errorf("start sandbox: %w", err)
	}
	s.cmd = cmd
	go func() {
		backend.AwaitExit(cmd.Process)
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	abort := func(e error) error {
		_ = cmd.Process.Kill()
		<-s.done
		h.statusR.Close()
		return e
	}
	if _, err := h.configW.Write(cfgData); err != nil {
		return abort(fmt.Errorf("send config: %w", err))
	}
	h.configW.Close()
	if h.layersHost != nil {
		if err := sendLayers(h.layersHost, cmd.Process.Pid, p.RootLayers); err != nil {
			return abort(&backend.SetupError{Msg: err.Error()})
		}
	}
	if err := awaitRunning(ctx, h.statusR); err != nil {
		return abort(err)
	}
	if p.ExportRoot {
		if s.upper, err = receiveUpper(h.layersHost); err != nil {
			return abort(&backend.SetupError{Msg: err.Error()})
		}
	}
	s.started = time.Now()
	go s.awaitExit(h.statusR)
	return nil
}

// initConfig is what init is told of spec; handOver completes it with
// the counts of the files it hands over.
func initConfig(spec *spec, bin *sandboxbin.Binary) nsinit.Config {
	p := &spec.Policy
	files := make([]nsinit.File, len(spec.Files))
	for i, f := range spec.Files {
		files[i] = nsinit.File{Name: f.Name, Data: f.Data}
	}
	// The policy's mounts, then where the airlock binary itself appears.
	mounts := p.Mounts
	for _, target := range spec.selfMounts {
		mounts = append(slices.Clip(mounts), policy.Mount{Source: bin.Path, Target: target, ReadOnly: true})
	}
	return nsinit.Config{
		Argv:           spec.Argv,
		Env:            layout.Env(p),
		Workdir:        p.Workdir,
		Hostname:       layout.Hostname,
		RootDir:        RootMountDir,
		DiskBytes:      p.DiskBytes,
		WritableBytes:  p.WritableBytes(),
		WritableInodes: p.WritableInodes(),
		Pids:           p.Pids,
		Mounts:         mounts,
		Files:          files,
		Networked:      spec.NetNS != nil,
		Layers:         len(p.RootLayers),
		Root:           p.Root,
		ExportRoot:     p.ExportRoot,
	}
}

// initCmd is init's process, yet without its path, files and I/O: in new
// namespaces, as the root of its own host id range from base.
func initCmd(base int, netns *os.File) *exec.Cmd {
	// A sandbox with a network is forked inside the namespace the host
	// made for it; one without gets a new, empty one.
	clone := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if netns == nil {
		clone |= unix.CLONE_NEWNET
	}
	return &exec.Cmd{
		// Init is the sandbox binary, executed through a descriptor of it
		// (the last of the files handed over, nsinit.FDs.Self), not by
		// its path: the exec happens after the child became the
		// sandbox's root, an unprivileged host uid that may not traverse
		// the state directory. The magic link skips that lookup.
		Args: []string{"airlock-sandbox", nsinit.Arg},
		Env:  []string{},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: clone,
			// The sandbox's own 65,536 ids: its root, its user, and
			// whatever ids an image's files have.
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: hostIDRange}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: hostIDRange}},
			// Without an explicit credential the child would keep host
			// uid 0 (unmapped, but still the owner of root's files).
			// Empty Groups drops host root's supplementary groups.
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
			GidMappingsEnableSetgroups: true,
			// A new session: no controlling terminal to inject input into.
			Setsid: true,
			// If airlock dies, the kernel kills the sandbox's init, and
			// with it every process of its pid namespace.
			Pdeathsig: syscall.SIGKILL,
		},
	}
}

// initFiles are the files the host hands init, each by its role in the
// layout of init's descriptors (nsinit.FDs).
type initFiles struct {
	config, status *os.File // init's ends of the pipes
	cgroups        []*os.File
	mounts         []*os.File
	layers         *os.File // init's end of the layers' socket; nil without an image
	command        []*os.File
	self           *os.File // the sandbox binary, which the caller keeps
}

// order places the files where fds names them, as exec.Cmd.ExtraFiles
// (whose first is descriptor 3). A file missing or left over for its role
// is an error: init would read another file in its place.
func (f *initFiles) order(fds nsinit.FDs) ([]*os.File, error) {
	out := make([]*os.File, fds.Count())
	var err error
	put := func(role string, fd int, file *os.File) {
		i := fd - nsinit.ConfigFD
		switch {
		case err != nil:
		case file == nil:
			err = fmt.Errorf("init's files: no %s for descriptor %d", role, fd)
		case i < 0 || i >= len(out) || out[i] != nil:
			err = fmt.Errorf("init's files: descriptor %d (%s) outside the layout or taken", fd, role)
		default:
			out[i] = file
		}
	}
	putAll := func(role string, fds []int, files []*os.File) {
		if len(fds) != len(files) && err == nil {
			err = fmt.Errorf("init's files: %d %s for %d descriptors", len(files), role, len(fds))
		}
		for i := range min(len(fds), len(files)) {
			put(role, fds[i], files[i])
		}
	}
	put("config", fds.Config, f.config)
	put("status", fds.Status, f.status)
	putAll("cgroup files", fds.Cgroups, f.cgroups)
	putAll("mount trees", fds.Mounts, f.mounts)
	if fds.Layers >= 0 || f.layers != nil {
		put("layers' socket", fds.Layers, f.layers)
	}
	putAll("command files", fds.Command, f.command)
	put("binary", fds.Self, f.self)
	if err == nil && slices.Contains(out, nil) {
		err = errors.New("init's files: a gap in the layout")
	}
	return out, err
}

// handover is a start's files: those handed to init, and the host's ends
// of the pipes and the socket they share with it.
type handover struct {
	initFiles
	releaseCgroup func()
	configW       *os.File // the config goes here
	statusR       *os.File // init's reports come here; whoever reads them closes it
	layersHost    *os.File // the layers go here, the writable layer comes back
}

// handOver opens what init is handed, by role, completes cfg with how
// many there are of each, and places each at the descriptor that cfg's
// layout (nsinit.FDs) names, in cmd. The files are the caller's to close
// (closeInit, closeHost) unless it fails.
func (s *Sandbox) handOver(spec *spec, cfg *nsinit.Config, cmd *exec.Cmd, bin *sandboxbin.Binary) (*handover, error) {
	h := &handover{releaseCgroup: func() {}}
	ok := false
	defer func() {
		if !ok {
			h.closeInit()
			h.closeHost()
			if h.statusR != nil {
				h.statusR.Close()
			}
		}
	}()
	var err error
	if h.config, h.configW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if h.statusR, h.status, err = os.Pipe(); err != nil {
		return nil, err
	}
	// Init must be born in, or join before it runs anything, its cgroups.
	if h.cgroups, h.releaseCgroup, err = s.cg.Enter(cmd.SysProcAttr); err != nil {
		h.releaseCgroup = func() {}
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	cfg.CgroupFiles = len(h.cgroups)
	if h.mounts, err = openMounts(cfg.Mounts, len(spec.Policy.Mounts)); err != nil {
		return nil, err
	}
	// The image's layers travel on a socket, once init's user namespace
	// exists: their idmapped mounts are made for it (layers.go).
	if len(spec.Policy.RootLayers) > 0 {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("layer socket: %w", err)
		}
		h.layersHost = os.NewFile(uintptr(pair[0]), "layers")
		h.layers = os.NewFile(uintptr(pair[1]), "layers")
	}
	h.command = spec.extraFiles
	cfg.CommandFiles = len(h.command)
	// Init's own binary last, which init closes first.
	h.self = bin.File
	fds := cfg.FDs()
	if cmd.ExtraFiles, err = h.order(fds); err != nil {
		return nil, err
	}
	cmd.Path = fmt.Sprintf("/proc/self/fd/%d", fds.Self)
	ok = true
	return h, nil
}

// closeInit closes the host's copies of init's files, all but the
// sandbox binary, once init has started (or failed to); closing one twice
// is harmless.
func (h *handover) closeInit() {
	closeAll(append(append(append([]*os.File{h.config, h.status, h.layers}, h.cgroups...), h.mounts...), h.command...))
	h.releaseCgroup()
}

// closeHost closes the host's ends but the status reader.
func (h *handover) closeHost() { closeAll([]*os.File{h.configW, h.layersHost}) }

// awaitRunning reads init's first report: 'R' once the command runs, or
// 'E' and why it could not. A setup that hangs is a failure too, not a
// hang of the caller, and so is one whose caller gave up (ctx).
func awaitRunning(ctx context.Context, statusR *os.File) error {
	statusR.SetReadDeadline(time.Now().Add(setupTimeout))
	stop := context.AfterFunc(ctx, func() { statusR.SetReadDeadline(time.Now()) })
	var first [1]byte
	_, err := io.ReadFull(statusR, first[:])
	if !stop() {
		// Canceled, whatever init said: the deadline the cancellation set
		// may land after the reset below and break the status reader.
		return ctx.Err()
	}
	if err != nil || first[0] != nsinit.StatusRunning {
		msg, _ := io.ReadAll(io.LimitReader(statusR, 4096))
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			msg = []byte(fmt.Sprintf("init did not report within %s", setupTimeout))
		case first[0] != nsinit.StatusFailed:
			msg = []byte("init ended without a report")
		}
		return &backend.SetupError{Msg: string(msg)}
	}
	statusR.SetReadDeadline(time.Time{})
	return nil
}

// awaitExit reads init's last report, how the command ended, and closes
// the status pipe.
func (s *Sandbox) awaitExit(statusR *os.File) {
	defer statusR.Close()
	var msg [5]byte
	if n, _ := io.ReadFull(statusR, msg[:]); n == 5 && msg[0] == nsinit.StatusExited {
		s.exited <- unix.WaitStatus(binary.LittleEndian.Uint32(msg[1:]))
	}
	close(s.exited)
}
