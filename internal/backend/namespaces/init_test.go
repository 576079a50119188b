package namespaces

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces/nsinit"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandboxbin"
)

// roleFiles opens, once each, a file named after a role ("mount2"), so
// that a test can tell by its name which file landed where.
type roleFiles struct {
	t     *testing.T
	dir   string
	files map[string]*os.File
}

func (r *roleFiles) get(role string) *os.File {
	if f, ok := r.files[role]; ok {
		return f
	}
	f, err := os.Create(filepath.Join(r.dir, role))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { f.Close() })
	r.files[role] = f
	return f
}

func (r *roleFiles) list(role string, n int) []*os.File {
	var fs []*os.File
	for i := range n {
		fs = append(fs, r.get(fmt.Sprintf("%s%d", role, i)))
	}
	return fs
}

// The host places every file init is handed where init, reading the
// config the host sent, looks for it: for every mix of cgroup files,
// policy and self mounts, image layers and command files.
func TestInitFilesAgreeWithInit(t *testing.T) {
	r := &roleFiles{t: t, dir: t.TempDir(), files: map[string]*os.File{}}
	bin := &sandboxbin.Binary{Path: "/state/airlock-sandbox", File: r.get("self")}
	for _, cgroups := range []int{0, 1, 3, 5} {
		for userMounts := range 3 {
			for self := range 3 {
				for _, layers := range []int{0, 1, 4} {
					for command := range 3 {
						name := fmt.Sprintf("cgroups=%d mounts=%d(%d idmapped)+%d layers=%d command=%d", cgroups, userMounts, userMounts/2, self, layers, command)
						p := policy.Default()
						// The first of them idmapped (a volume), when there are two.
						idm := userMounts / 2
						for i := range userMounts {
							p.Mounts = append(p.Mounts, policy.Mount{Source: "/src", Target: fmt.Sprintf("/m%d", i), IDMapped: i < idm})
						}
						p.RootLayers = make([]string, layers)
						s := &spec{Spec: &backend.Spec{Policy: p, Argv: []string{"true"}}, extraFiles: r.list("command", command),
							selfMounts: []string{"/.airlock/bin/airlock", "/usr/local/bin/sudo"}[:self]}
						cfg := initConfig(s, bin)
						// What handOver sets as it opens the files.
						cfg.CgroupFiles, cfg.CommandFiles = cgroups, command
						files := initFiles{config: r.get("config"), status: r.get("status"), cgroups: r.list("cgroup", cgroups),
							mounts: r.list("mount", len(cfg.Mounts)-idm), command: s.extraFiles, self: bin.File}
						if layers > 0 || idm > 0 {
							files.layers = r.get("layers")
						}
						extra, err := files.order(cfg.FDs())
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						checkInitReads(t, name, &cfg, extra)
					}
				}
			}
		}
	}
}

// checkInitReads decodes cfg as init does and checks that each
// descriptor init reads by its role holds the file of that role.
func checkInitReads(t *testing.T, name string, cfg *nsinit.Config, extra []*os.File) {
	t.Helper()
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := nsinit.ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	fds := got.FDs()
	at := func(fd int) string {
		if i := fd - 3; i >= 0 && i < len(extra) {
			return filepath.Base(extra[i].Name())
		}
		return fmt.Sprintf("nothing at %d", fd)
	}
	want := map[int]string{fds.Config: "config", fds.Status: "status", fds.Self: "self"}
	for i, fd := range fds.Cgroups {
		want[fd] = fmt.Sprintf("cgroup%d", i)
	}
	for i, fd := range fds.Mounts {
		want[fd] = fmt.Sprintf("mount%d", i)
	}
	if fds.Layers >= 0 {
		want[fds.Layers] = "layers"
	} else if cfg.Layers > 0 || slices.ContainsFunc(cfg.Mounts, func(m policy.Mount) bool { return m.IDMapped }) {
		t.Errorf("%s: init expects no layers' socket", name)
	}
	for i, fd := range fds.Command {
		want[fd] = fmt.Sprintf("command%d", i)
	}
	if len(want) != len(extra) {
		t.Errorf("%s: init reads %d descriptors, the host hands %d", name, len(want), len(extra))
	}
	for fd, role := range want {
		if at(fd) != role {
			t.Errorf("%s: init reads its %s at %d, where the host put %s", name, role, fd, at(fd))
		}
	}
	if len(got.Mounts) != len(cfg.Mounts) || got.CgroupFiles != cfg.CgroupFiles || got.CommandFiles != cfg.CommandFiles {
		t.Errorf("%s: the config changed on its way: %+v", name, got)
	}
}

// A file missing for its role, or one too many, is refused rather than
// shifting every later descriptor.
func TestInitFilesOrderRefusesMismatches(t *testing.T) {
	r := &roleFiles{t: t, dir: t.TempDir(), files: map[string]*os.File{}}
	whole := func() initFiles {
		return initFiles{config: r.get("config"), status: r.get("status"), cgroups: r.list("cgroup", 2),
			mounts: r.list("mount", 1), command: r.list("command", 1), self: r.get("self")}
	}
	cfg := &nsinit.Config{CgroupFiles: 2, Mounts: make([]policy.Mount, 1), CommandFiles: 1}
	if _, err := (&initFiles{}).order(cfg.FDs()); err == nil {
		t.Error("no files at all: accepted")
	}
	for _, tc := range []struct {
		name   string
		change func(*initFiles)
	}{
		{"a cgroup file short", func(f *initFiles) { f.cgroups = f.cgroups[:1] }},
		{"a mount tree too many", func(f *initFiles) { f.mounts = r.list("mount", 2) }},
		{"a layers' socket without layers", func(f *initFiles) { f.layers = r.get("layers") }},
		{"no binary", func(f *initFiles) { f.self = nil }},
		{"no status pipe", func(f *initFiles) { f.status = nil }},
	} {
		f := whole()
		if _, err := f.order(cfg.FDs()); err != nil {
			t.Fatalf("whole: %v", err)
		}
		tc.change(&f)
		if _, err := f.order(cfg.FDs()); err == nil || !strings.Contains(err.Error(), "init's files") {
			t.Errorf("%s: got %v, want a refusal", tc.name, err)
		}
	}
	layered := &nsinit.Config{Layers: 2}
	if _, err := (&initFiles{config: r.get("config"), status: r.get("status"), self: r.get("self")}).order(layered.FDs()); err == nil {
		t.Error("layers without a layers' socket: accepted")
	}
}

// What init is told: the policy's mounts then the binary's, without
// touching the policy's own list; the limits and identity of the policy.
func TestInitConfig(t *testing.T) {
	p := policy.Default()
	p.Mounts = make([]policy.Mount, 1, 4) // room to append into: it must not be used
	p.Mounts[0] = policy.Mount{Source: "/data", Target: "/data"}
	p.Env = []string{"A=1"}
	s := &spec{Spec: &backend.Spec{Policy: p, Argv: []string{"/bin/true"}, Files: []backend.File{{Name: "main.py", Data: []byte("x")}}},
		selfMounts: []string{"/a", "/b"}}
	cfg := initConfig(s, &sandboxbin.Binary{Path: "/state/bin"})
	want := []policy.Mount{{Source: "/data", Target: "/data"}, {Source: "/state/bin", Target: "/a", ReadOnly: true}, {Source: "/state/bin", Target: "/b", ReadOnly: true}}
	if !slices.Equal(cfg.Mounts, want) {
		t.Errorf("mounts %+v, want %+v", cfg.Mounts, want)
	}
	if full := p.Mounts[:cap(p.Mounts)]; full[1] != (policy.Mount{}) {
		t.Errorf("the policy's mount list was written into: %+v", full)
	}
	if cfg.RootDir != RootMountDir || cfg.Pids != p.Pids || cfg.DiskBytes != p.DiskBytes || cfg.WritableBytes != p.WritableBytes() ||
		cfg.Networked || cfg.Layers != 0 || len(cfg.Files) != 1 || cfg.Files[0].Name != "main.py" {
		t.Errorf("config %+v", cfg)
	}
	if !slices.Contains(cfg.Env, "A=1") {
		t.Errorf("env %v lacks the policy's", cfg.Env)
	}
}

// Init's process: every namespace new but the network of a sandbox that
// has one, the sandbox's ids mapped, its credentials explicit.
func TestInitCmd(t *testing.T) {
	cmd := initCmd(&initFork{base: hostIDBase, cgroupFD: -1})
	a := cmd.SysProcAttr
	all := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWNET)
	if a.Cloneflags != all {
		t.Errorf("clone flags %#x, want %#x", a.Cloneflags, all)
	}
	if m := a.UidMappings; len(m) != 1 || m[0] != (syscall.SysProcIDMap{ContainerID: 0, HostID: hostIDBase, Size: hostIDRange}) {
		t.Errorf("uid map %+v", m)
	}
	if c := a.Credential; c == nil || c.Uid != 0 || c.Gid != 0 || c.Groups == nil || len(c.Groups) != 0 {
		t.Errorf("credential %+v: want uid 0, gid 0 and no groups, explicitly", c)
	}
	if !a.Setsid || a.Pdeathsig != syscall.SIGKILL || len(cmd.Env) != 0 || cmd.Args[1] != nsinit.Arg || cmd.Stdin != nil || a.UseCgroupFD {
		t.Errorf("process %+v %+v", a, cmd)
	}
	netns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	if f := initCmd(&initFork{base: hostIDBase, netns: netns, cgroupFD: 7}).SysProcAttr; f.Cloneflags&unix.CLONE_NEWNET != 0 || !f.UseCgroupFD || f.CgroupFD != 7 {
		t.Errorf("a sandbox with a network gets a new one too, or its cgroup is not set: %+v", f)
	}
}
