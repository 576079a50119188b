// Package gvisor runs sandboxes under gVisor's user-space kernel (runsc):
// untrusted code talks to gVisor's Sentry, not to the host kernel.
package gvisor

import (
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
)

// StateDir holds runsc's state, the OCI bundles and one lock file per
// running sandbox.
var StateDir = "/run/airlock-gvisor"

// Identities inside the sandbox, as on the namespaces backend.
const sandboxUID, sandboxGID = 1000, 1000

// idleHostTasks is how many host tasks an idle gVisor sandbox uses (the
// Sentry's threads, the gofer); each guest process adds about two. The
// pids cgroup counts host tasks, so the user's limit is translated.
const idleHostTasks = 32

// FindRunsc returns the runsc to use: path if given, else $AIRLOCK_RUNSC,
// else runsc on PATH. It must be statically linked: a dynamically linked
// runsc fails after its pivot_root ("fork/exec /proc/self/exe: no such
// file or directory").
func FindRunsc(path string) (string, error) {
	if path == "" {
		path = os.Getenv("AIRLOCK_RUNSC")
	}
	if path == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return "", errors.New("runsc not found: install it (make install-runsc) or pass --runsc PATH")
		}
		path = p
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("runsc at %s is not an executable: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("runsc at %s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	return path, nil
}

// Run executes spec in a new gVisor sandbox under its policy's timeout and
// removes the sandbox before returning.
func Run(ctx context.Context, runsc string, spec *namespaces.Spec) (*namespaces.Result, error) {
	if err := namespaces.Check(spec); err != nil {
		return nil, err
	}
	if err := Cleanup(runsc); err != nil {
		return nil, fmt.Errorf("cleanup of earlier sandboxes: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	id := "airlock-" + hex.EncodeToString(b[:])
	bundle := filepath.Join(StateDir, "bundles", id)
	if err := os.MkdirAll(bundle, 0o711); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	// The lock says "alive" to Cleanup; it is released with the sandbox.
	lock, err := os.OpenFile(filepath.Join(bundle, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		os.RemoveAll(bundle)
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		os.RemoveAll(bundle)
		return nil, err
	}
	defer func() {
		teardown(runsc, id)
		os.RemoveAll(bundle)
		lock.Close()
	}()
	if err := writeBundle(bundle, id, spec); err != nil {
		return nil, err
	}
	p := &spec.Policy
	// create + start + wait rather than run: run deletes the container,
	// cgroups included, before its memory and OOM counters can be read.
	// The sandbox keeps the pipes given to create; create's Wait returns
	// when the sandbox has closed them (at its end).
	create := runscCmd(runsc, id, "create", "--bundle", bundle, id)
	stdout := namespaces.NewCappedWriter(spec.Stdout, p.OutputLimit)
	stderr := namespaces.NewCappedWriter(spec.Stderr, p.OutputLimit)
	create.Stdout, create.Stderr = stdout, stderr
	if spec.Stdin != nil {
		create.Stdin = struct{ io.Reader }{spec.Stdin} // a pipe, never a terminal
	}
	create.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := create.Start(); err != nil {
		return nil, fmt.Errorf("start runsc: %w", err)
	}
	output := make(chan struct{})
	go func() { create.Wait(); close(output) }()
	// create's process exits once the sandbox exists; its pipes stay open.
	for create.ProcessState == nil {
		if err := create.Process.Signal(syscall.Signal(0)); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if out, err := runscCmd(runsc, id, "start", id).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("start sandbox: %v: %s", err, strings.TrimSpace(string(out)))
	}
	start := time.Now()
	type waitResult struct {
		ExitStatus int `json:"exitStatus"`
	}
	waited := make(chan waitResult, 1)
	go func() {
		var wr waitResult
		out, err := runscCmd(runsc, id, "wait", id).Output()
		if err != nil || json.Unmarshal(out, &wr) != nil {
			wr.ExitStatus = 128 + int(syscall.SIGKILL)
		}
		waited <- wr
	}()
	timer := time.NewTimer(p.Timeout)
	defer timer.Stop()
	res := &namespaces.Result{}
	var wr waitResult
	select {
	case wr = <-waited:
	case <-timer.C:
		res.TimedOut = true
		runscCmd(runsc, id, "kill", "--all", id, "KILL").Run()
		wr = <-waited
	case <-ctx.Done():
		runscCmd(runsc, id, "kill", "--all", id, "KILL").Run()
		<-waited
		return nil, ctx.Err()
	}
	res.Duration = time.Since(start)
	// Let the output drain: the pipes close with the sandbox.
	select {
	case <-output:
	case <-time.After(2 * time.Second):
	}
	// runsc reports 128+N when signal N ended the container.
	res.ExitCode = wr.ExitStatus
	if wr.ExitStatus > 128 && wr.ExitStatus < 128+65 {
		res.ExitCode, res.Signal = -1, unix.SignalName(syscall.Signal(wr.ExitStatus-128))
	}
	if res.TimedOut {
		res.ExitCode, res.Signal = -1, "SIGKILL"
	}
	mem := filepath.Join("/sys/fs/cgroup/memory", id)
	if v, err := readUint(filepath.Join(mem, "memory.max_usage_in_bytes")); err == nil {
		res.MaxMemoryBytes = int64(v)
	}
	if data, err := os.ReadFile(filepath.Join(mem, "memory.oom_control")); err == nil {
		res.OOMKilled = !res.TimedOut && res.Signal == "SIGKILL" && !strings.Contains(string(data), "oom_kill 0")
	}
	if v, err := readUint(filepath.Join("/sys/fs/cgroup/cpuacct", id, "cpuacct.usage")); err == nil {
		res.CPU = time.Duration(v)
	}
	res.StdoutTruncated, res.StderrTruncated = stdout.Truncated(), stderr.Truncated()
	return res, nil
}

func runscCmd(runsc, id string, args ...string) *exec.Cmd {
	return runscFlags(runsc, id, nil, args...)
}

// runscFlags runs runsc for sandbox id with the backend's global flags,
// extra ones, and a subcommand. Each sandbox has a runsc root of its own:
// with --network=none runsc keeps a bind-mounted network namespace file in
// its root, and a private root lets teardown remove it with the sandbox.
func runscFlags(runsc, id string, extra []string, args ...string) *exec.Cmd {
	base := []string{"--root", filepath.Join(StateDir, "state", id), "--network", "none", "--platform", "systrap"}
	return exec.Command(runsc, append(append(base, extra...), args...)...)
}

// teardown deletes sandbox id from runsc and removes runsc's state for it,
// the network namespace mount included.
func teardown(runsc, id string) error {
	out, err := runscCmd(runsc, id, "delete", "-force", id).CombinedOutput()
	root := filepath.Join(StateDir, "state", id)
	if e := unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH); e != nil && !errors.Is(e, unix.EINVAL) && !errors.Is(e, unix.ENOENT) {
		return fmt.Errorf("unmount runsc's network namespace: %w", e)
	}
	os.RemoveAll(root)
	if err != nil && !strings.Contains(string(out), "not exist") && !strings.Contains(string(out), "not found") {
		return fmt.Errorf("runsc delete: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func readUint(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
}

// writeBundle writes the OCI bundle: a read-only root of mount points, the
// template's /etc and code files, and config.json.
func writeBundle(bundle, id string, spec *namespaces.Spec, extra ...specs.Mount) error {
	p := &spec.Policy
	root := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"usr", "etc", "proc", "dev", "tmp", "home/user"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
		{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		// gVisor's tmpfs cannot share one size limit between two mounts:
		// each gets the disk limit.
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", p.DiskBytes)}},
		{Destination: "/home/user", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=700",
			fmt.Sprintf("uid=%d", sandboxUID), fmt.Sprintf("gid=%d", sandboxGID), fmt.Sprintf("size=%d", p.DiskBytes)}},
	}
	for _, name := range namespaces.HostRootLinks() {
		if fi, err := os.Lstat("/" + name); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink("/" + name)
			os.Symlink(target, filepath.Join(root, name))
		}
	}
	for name, data := range namespaces.GeneratedEtc(namespaces.Hostname) {
		if err := os.WriteFile(filepath.Join(root, "etc", name), data, 0o644); err != nil {
			return err
		}
	}
	for _, name := range namespaces.HostEtc() {
		src := "/etc/" + name
		fi, err := os.Stat(src)
		if err != nil {
			continue
		}
		dst := filepath.Join(root, "etc", name)
		if fi.IsDir() {
			os.MkdirAll(dst, 0o755)
		} else {
			os.WriteFile(dst, nil, 0o644)
		}
		mounts = append(mounts, specs.Mount{Destination: "/etc/" + name, Type: "bind", Source: src, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if len(spec.Files) > 0 {
		os.MkdirAll(filepath.Join(root, namespaces.CodeDir), 0o755)
		code := filepath.Join(bundle, "code")
		if err := os.MkdirAll(code, 0o755); err != nil {
			return err
		}
		for _, f := range spec.Files {
			if err := os.WriteFile(filepath.Join(code, f.Name), f.Data, 0o444); err != nil {
				return err
			}
		}
		mounts = append(mounts, specs.Mount{Destination: namespaces.CodeDir, Type: "bind", Source: code, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	for _, m := range p.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		if err := os.MkdirAll(filepath.Join(root, m.Target), 0o755); err != nil {
			return err
		}
		mounts = append(mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: opts})
	}
	for _, m := range extra {
		dst := filepath.Join(root, m.Destination)
		if fi, err := os.Stat(m.Source); err == nil && !fi.IsDir() {
			os.MkdirAll(filepath.Dir(dst), 0o755)
			os.WriteFile(dst, nil, 0o644)
		} else {
			os.MkdirAll(dst, 0o755)
		}
		mounts = append(mounts, m)
	}
	mem := p.MemoryBytes
	pids := idleHostTasks + 2*p.Pids
	period := uint64(100_000)
	quota := max(int64(p.CPUs*float64(period)), 1000)
	rl := func(typ string, v uint64) specs.POSIXRlimit { return specs.POSIXRlimit{Type: typ, Hard: v, Soft: v} }
	cfg := specs.Spec{
		Version:  specs.Version,
		Hostname: namespaces.Hostname,
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			Args: spec.Argv,
			Env:  namespaces.DefaultEnv(p),
			Cwd:  p.Workdir,
			User: specs.User{UID: sandboxUID, GID: sandboxGID, AdditionalGids: []uint32{sandboxGID}},
			// No capability in any set, and none to be gained.
			Capabilities:    &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{}},
			NoNewPrivileges: true,
			Rlimits: []specs.POSIXRlimit{
				rl("RLIMIT_CORE", 0), rl("RLIMIT_NOFILE", 4096), rl("RLIMIT_NPROC", uint64(p.Pids)),
				rl("RLIMIT_FSIZE", uint64(p.DiskBytes)),
			},
		},
		Mounts: mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem},
				Pids:   &specs.LinuxPids{Limit: pids},
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
			},
			CgroupsPath: "/" + id,
		},
	}
	data, err := json.MarshalIndent(&cfg, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644)
}

// Cleanup removes the gVisor sandboxes of earlier, killed airlock runs:
// bundles whose lock nobody holds, with their runsc state and cgroups.
func Cleanup(runsc string) error {
	entries, _ := os.ReadDir(filepath.Join(StateDir, "bundles"))
	for _, e := range entries {
		dir := filepath.Join(StateDir, "bundles", e.Name())
		f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR, 0)
		if err == nil {
			if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
				f.Close()
				continue // alive
			}
			f.Close()
		} else if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue // being created
		}
		teardown(runsc, e.Name())
		os.RemoveAll(filepath.Join(StateDir, "agents", e.Name()))
		os.RemoveAll(dir)
	}
	return nil
}
