package namespaces

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
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
	p := &spec.Policy
	cfg := initConfig(spec, bin)
	fork := &initFork{base: s.HostUID - layout.UID, netns: spec.NetNS, cgroupFD: -1}
	h, err := s.handOver(spec, &cfg, fork, bin)
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
	// Init's output and input go through pipes of this process, copied
	// here: whichever process forks init has no part in them.
	streams, err := s.openStdio(spec, fork)
	if err != nil {
		h.closeInit()
		h.statusR.Close()
		return err
	}
	proc, err := forkInit(fork)
	h.closeInit()
	streams.closeInit()
	if err != nil {
		streams.closeHost()
		h.statusR.Close()
		return fmt.Errorf("start sandbox: %w", err)
	}
	s.proc = proc
	if spec.oneLog {
		s.logR = streams.outR
	}
	streams.copy(s, spec)
	go func() {
		s.status, s.cpu, s.waitErr = proc.Wait()
		streams.drain()
		close(s.done)
	}()
	abort := func(e error) error {
		_ = proc.Signal(syscall.SIGKILL)
		<-s.done
		h.statusR.Close()
		return e
	}
	if _, err := h.configW.Write(cfgData); err != nil {
		return abort(fmt.Errorf("send config: %w", err))
	}
	h.configW.Close()
	if h.layersHost != nil {
		if err := sendLayers(h.layersHost, proc, p.RootLayers, idMapped(p.Mounts)); err != nil {
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

// stdio is a sandbox's standard streams: init's ends of their pipes, and
// the host's, which copy them to and from the spec's readers and writers.
type stdio struct {
	inW, outR, errR *os.File // the host's ends; inW and errR may be nil
	init            []*os.File
	copying         sync.WaitGroup
}

// openStdio makes the pipes of spec's standard streams and gives init's
// ends to fork. One log (spec.oneLog) is one pipe for both.
func (s *Sandbox) openStdio(spec *spec, fork *initFork) (*stdio, error) {
	p := &spec.Policy
	s.stdout = backend.NewCappedWriter(spec.Stdout, p.OutputLimit)
	s.stderr = s.stdout
	sio := &stdio{}
	ok := false
	defer func() {
		if !ok {
			sio.closeInit()
			sio.closeHost()
		}
	}()
	var err error
	if sio.outR, fork.stdout, err = os.Pipe(); err != nil {
		return nil, err
	}
	sio.init = append(sio.init, fork.stdout)
	fork.stderr = fork.stdout
	if !spec.oneLog {
		s.stderr = backend.NewCappedWriter(spec.Stderr, p.OutputLimit)
		if sio.errR, fork.stderr, err = os.Pipe(); err != nil {
			return nil, err
		}
		sio.init = append(sio.init, fork.stderr)
	}
	if spec.Stdin != nil {
		// Copied through a pipe: a terminal must never be handed to the
		// sandbox.
		if fork.stdin, sio.inW, err = os.Pipe(); err != nil {
			return nil, err
		}
		sio.init = append(sio.init, fork.stdin)
	}
	ok = true
	return sio, nil
}

// copy starts copying the streams, once init holds its ends.
func (sio *stdio) copy(s *Sandbox, spec *spec) {
	pump := func(w io.Writer, r *os.File) {
		sio.copying.Add(1)
		go func() {
			defer sio.copying.Done()
			io.Copy(w, r)
		}()
	}
	pump(s.stdout, sio.outR)
	if sio.errR != nil {
		pump(s.stderr, sio.errR)
	}
	if sio.inW != nil {
		// Not waited for: a read of a terminal may block forever.
		go func() {
			io.Copy(sio.inW, spec.Stdin)
			sio.inW.Close()
		}()
	}
}

// drain waits, once init has ended, for its output to be copied: the
// pipes close when the last process of the sandbox is gone, which follows
// init's death at once. Should something hold them open, a second bounds
// the wait, as exec.Cmd.WaitDelay would.
func (sio *stdio) drain() {
	copied := make(chan struct{})
	go func() { sio.copying.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(time.Second):
	}
	sio.closeHost()
}

func (sio *stdio) closeInit() { closeAll(sio.init) }
func (sio *stdio) closeHost() { closeAll([]*os.File{sio.inW, sio.outR, sio.errR}) }

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
	// The CA goes into the image's own store; the host's root gets the
	// host's store with it, mounted over the host's (last: TrustMount).
	var trustPEM []byte
	env := layout.Env(p)
	trustMount := spec.trust.pem != nil && len(p.RootLayers) == 0 && spec.trust.bundle != ""
	if trustMount {
		mounts = append(slices.Clip(mounts), policy.Mount{Source: spec.trust.bundle, Target: layout.CABundle, ReadOnly: true})
		env = layout.MergeEnv(env, layout.TrustEnv())
	} else if len(p.RootLayers) > 0 {
		trustPEM = spec.trust.pem // init adds TrustEnv where the image has a store
	}
	return nsinit.Config{
		Argv:           spec.Argv,
		Env:            env,
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
		TrustMount:     trustMount,
		TrustPEM:       trustPEM,
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

// order places the files where fds names them, as initFork.files
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
// layout (nsinit.FDs) names, in fork. The files are the caller's to close
// (closeInit, closeHost) unless it fails.
func (s *Sandbox) handOver(spec *spec, cfg *nsinit.Config, fork *initFork, bin *sandboxbin.Binary) (*handover, error) {
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
	var attr syscall.SysProcAttr
	if h.cgroups, h.releaseCgroup, err = s.cg.Enter(&attr); err != nil {
		h.releaseCgroup = func() {}
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if attr.UseCgroupFD {
		fork.cgroupFD = attr.CgroupFD
	}
	cfg.CgroupFiles = len(h.cgroups)
	if h.mounts, err = openMounts(cfg.Mounts, len(spec.Policy.Mounts)); err != nil {
		return nil, err
	}
	// The image's layers and the idmapped mounts travel on a socket,
	// once init's user namespace exists: they are made for it
	// (layers.go).
	if len(spec.Policy.RootLayers) > 0 || len(idMapped(spec.Policy.Mounts)) > 0 {
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
	if fork.files, err = h.order(fds); err != nil {
		return nil, err
	}
	fork.path = fmt.Sprintf("/proc/self/fd/%d", fds.Self)
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
