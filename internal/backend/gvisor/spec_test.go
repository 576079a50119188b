package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// specBundle is a bundle in a temporary directory, with the limits
// newBundle gives its cgroup, which is not made.
func specBundle(t *testing.T, p *policy.Policy) *bundle {
	b := &bundle{id: "0123456789abcdef", dir: t.TempDir(), stateDir: t.TempDir(), cg: cgroups.Load(cgroups.Prefix + "0123456789abcdef")}
	b.limits = *p
	b.limits.Pids = idleHostTasks + 4*p.Pids
	return b
}

func readSpec(t *testing.T, b *bundle) *specs.Spec {
	t.Helper()
	path := filepath.Join(b.dir, "config.json")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config.json: %v %v", fi, err)
	}
	data, _ := os.ReadFile(path)
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// The process runs as the sandbox's user, with no capability, no new
// privileges and the policy's rlimits; the resources are the cgroup's.
func TestWriteConfig(t *testing.T) {
	p := policy.Default()
	p.Env = []string{"A=1"}
	b := specBundle(t, &p)
	mounts := []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}}
	if err := (&Backend{}).writeConfig(b, &backend.Spec{Policy: p, Argv: []string{"/bin/true"}}, mounts); err != nil {
		t.Fatal(err)
	}
	s := readSpec(t, b)
	proc := s.Process
	if proc.User.UID != layout.UID || proc.User.GID != layout.GID || !slices.Equal(proc.User.AdditionalGids, []uint32{layout.GID}) {
		t.Errorf("user %+v", proc.User)
	}
	c := proc.Capabilities
	if c == nil || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("capabilities %+v", c)
	}
	if !proc.NoNewPrivileges || proc.Cwd != p.Workdir || !slices.Equal(proc.Args, []string{"/bin/true"}) || !slices.Equal(proc.Env, layout.Env(&p)) {
		t.Errorf("process %+v", proc)
	}
	rl := map[string]uint64{}
	for _, r := range proc.Rlimits {
		if r.Hard != r.Soft {
			t.Errorf("%s: soft %d, hard %d", r.Type, r.Soft, r.Hard)
		}
		rl[r.Type] = r.Hard
	}
	if rl["RLIMIT_CORE"] != 0 || rl["RLIMIT_NOFILE"] != 4096 || rl["RLIMIT_NPROC"] != uint64(p.Pids) || rl["RLIMIT_FSIZE"] != uint64(p.DiskBytes) {
		t.Errorf("rlimits %v", rl)
	}
	if s.Root == nil || s.Root.Path != "rootfs" || !s.Root.Readonly || s.Hostname != layout.Hostname {
		t.Errorf("root %+v hostname %q", s.Root, s.Hostname)
	}
	var types []string
	for _, ns := range s.Linux.Namespaces {
		types = append(types, string(ns.Type))
		if ns.Path != "" {
			t.Errorf("namespace %s joins %s", ns.Type, ns.Path)
		}
	}
	if !slices.Equal(types, []string{"pid", "network", "ipc", "uts", "mount"}) {
		t.Errorf("namespaces %v", types)
	}
	r := s.Linux.Resources
	if s.Linux.CgroupsPath != "/airlock-0123456789abcdef" || *r.Memory.Limit != p.MemoryBytes || *r.Memory.Swap != p.MemoryBytes ||
		r.Pids.Limit != b.limits.Pids || *r.CPU.Period != 100_000 || *r.CPU.Quota != int64(p.CPUs*100_000) {
		t.Errorf("cgroup %q resources %+v", s.Linux.CgroupsPath, r)
	}
	if len(s.Mounts) != 1 || s.Mounts[0].Destination != "/proc" {
		t.Errorf("mounts %+v", s.Mounts)
	}
}

// A sandbox of an image with a root: uid 0 of gVisor's kernel with a
// container's capabilities, a writable root; one with a network joins
// the namespace the host made.
func TestWriteConfigRootAndNetwork(t *testing.T) {
	p := policy.Default()
	p.Root = true
	b := specBundle(t, &p)
	b.image = true
	netns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	if err := (&Backend{}).writeConfig(b, &backend.Spec{Policy: p, Argv: []string{"sh"}, NetNS: netns}, nil); err != nil {
		t.Fatal(err)
	}
	s := readSpec(t, b)
	if s.Process.User.UID != 0 || s.Process.User.GID != 0 {
		t.Errorf("user %+v", s.Process.User)
	}
	caps := s.Process.Capabilities
	if !slices.Contains(caps.Effective, "CAP_CHOWN") || slices.Contains(caps.Bounding, "CAP_SYS_ADMIN") || len(caps.Ambient) != 0 {
		t.Errorf("capabilities %+v", caps)
	}
	if s.Root.Readonly {
		t.Error("an image's root is read-only")
	}
	want := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), netns.Fd())
	if ns := s.Linux.Namespaces[1]; ns.Type != "network" || ns.Path != want {
		t.Errorf("network namespace %+v, want %s", ns, want)
	}
}

// Code files are written read-only into the bundle and mounted read-only
// at CodeDir; without files there is no mount.
func TestCodeMount(t *testing.T) {
	p := policy.Default()
	b := specBundle(t, &p)
	if m, err := b.codeMount(&backend.Spec{}); err != nil || m != nil {
		t.Errorf("no files: %+v %v", m, err)
	}
	m, err := b.codeMount(&backend.Spec{Files: []backend.File{{Name: "main.py", Data: []byte("print(1)")}}})
	if err != nil || len(m) != 1 {
		t.Fatalf("%+v %v", m, err)
	}
	if m[0].Destination != layout.CodeDir || m[0].Source != filepath.Join(b.dir, "code") || !slices.Contains(m[0].Options, "ro") {
		t.Errorf("mount %+v", m[0])
	}
	fi, err := os.Stat(filepath.Join(b.dir, "code", "main.py"))
	if err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("code file %v %v", fi, err)
	}
}

// The host view's bundle: mount points in a read-only root, the merged
// /usr's links as the host has them, /etc as one read-only copy, and a
// mount point of each extra mount's kind.
func TestWriteBundleHostView(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root): the copy of /etc reads all of it")
	}
	p := policy.Default()
	b := specBundle(t, &p)
	be := &Backend{stateDir: b.stateDir}
	file := filepath.Join(t.TempDir(), "bin")
	os.WriteFile(file, []byte("x"), 0o755)
	extra := []specs.Mount{{Destination: layout.AgentPath, Type: "bind", Source: file, Options: []string{"bind", "ro"}},
		{Destination: "/.airlock/run", Type: "bind", Source: t.TempDir()}}
	if err := be.writeBundle(b, &backend.Spec{Policy: p, Argv: []string{"x"}}, extra...); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(b.dir, "rootfs")
	for _, d := range []string{"usr", "etc", "proc", "dev", "tmp", "home/user", ".airlock/run"} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || !fi.IsDir() {
			t.Errorf("mount point %s: %v", d, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(root, layout.AgentPath)); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the agent's mount point is not a file: %v %v", fi, err)
	}
	for _, name := range layout.HostRootLinks {
		host, _ := os.Readlink("/" + name)
		if got, _ := os.Readlink(filepath.Join(root, name)); got != host {
			t.Errorf("/%s -> %q, the host's -> %q", name, got, host)
		}
	}
	s := readSpec(t, b)
	byDest := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		byDest[m.Destination] = m
	}
	for dest, opt := range map[string]string{"/usr": "ro", "/etc": "ro", "/tmp": "mode=1777", layout.Home: fmt.Sprintf("uid=%d", layout.UID), layout.AgentPath: "ro"} {
		if !slices.Contains(byDest[dest].Options, opt) {
			t.Errorf("mount %s: %+v lacks %s", dest, byDest[dest], opt)
		}
	}
	if _, ok := byDest["/dev"]; ok {
		t.Error("a /dev mount: gVisor gives its own")
	}
}
