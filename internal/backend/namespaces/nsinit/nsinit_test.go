package nsinit

import (
	"encoding/json"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

func TestParseConfig(t *testing.T) {
	want := Config{Argv: []string{"/bin/sh", "-c", "true"}, Env: []string{"A=1"}, Workdir: "/home/user", Pids: 64,
		Mounts: []policy.Mount{{Source: "/s", Target: "/t", ReadOnly: true}}, Files: []File{{Name: "a.py", Data: []byte{0, 1, 2}}},
		Layers: 2, CgroupFiles: 3, CommandFiles: 1, Networked: true}
	data, err := json.Marshal(&want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Argv, want.Argv) || got.Mounts[0] != want.Mounts[0] || string(got.Files[0].Data) != "\x00\x01\x02" ||
		got.Layers != 2 || got.CgroupFiles != 3 || got.CommandFiles != 1 || !got.Networked || got.Pids != 64 {
		t.Errorf("round trip: %+v", got)
	}
	for _, bad := range []string{``, `{`, `{"Argv":[]}`, `{"Env":["A=1"]}`, `[]`, `{"Layers":"two","Argv":["x"]}`, `{"Argv":["x"],"CommandFiles":-1}`} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("ParseConfig(%q) succeeded", bad)
		}
	}
}

// Landlock: the scratch places and read-write mounts are writable; an
// image's root is writable whole; read-only mounts are not.
func TestWritablePaths(t *testing.T) {
	mounts := []policy.Mount{{Target: "/data", ReadOnly: true}, {Target: "/out"}}
	if got, want := writablePaths(&Config{Mounts: mounts}), []string{"/tmp", "/home/user", "/dev/shm", "/out"}; !slices.Equal(got, want) {
		t.Errorf("host view: %v, want %v", got, want)
	}
	if got, want := writablePaths(&Config{Layers: 1, Mounts: mounts}), []string{"/", "/out"}; !slices.Equal(got, want) {
		t.Errorf("an image's root: %v, want %v", got, want)
	}
	for _, d := range writableDevices {
		if !slices.Contains(hostDevices, strings.TrimPrefix(d, "/dev/")) {
			t.Errorf("%s is writable but not in the sandbox's /dev", d)
		}
	}
}

func TestRlimits(t *testing.T) {
	got := map[string]uint64{}
	for _, l := range rlimits(&Config{Pids: 77, DiskBytes: 1 << 30}) {
		got[l.name] = l.value
		if l.resource == unix.RLIMIT_AS {
			t.Error("RLIMIT_AS breaks numpy: memory is the cgroup's")
		}
	}
	want := map[string]uint64{"core": 0, "nofile": 4096, "nproc": 77, "fsize": 1 << 30}
	if len(got) != len(want) {
		t.Errorf("rlimits %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
}

func TestLastCap(t *testing.T) {
	n, err := lastCap()
	if err != nil || n < unix.CAP_SYS_ADMIN {
		t.Errorf("lastCap() = %d, %v", n, err)
	}
	for _, c := range rootCaps {
		if c == unix.CAP_SYS_ADMIN || c == unix.CAP_SYS_PTRACE || c == unix.CAP_SYS_MODULE || c == unix.CAP_MKNOD {
			t.Errorf("an image's root keeps capability %d", c)
		}
	}
}

func TestIsInit(t *testing.T) {
	args := os.Args
	defer func() { os.Args = args }()
	os.Args = []string{"airlock-sandbox", Arg}
	if !IsInit() {
		t.Error("not init with its argument")
	}
	for _, a := range [][]string{{"airlock-sandbox"}, {"airlock-sandbox", "agent"}, {Arg}} {
		os.Args = a
		if IsInit() {
			t.Errorf("init with %q", a)
		}
	}
}

// joinCgroups writes the calling thread into each tasks file and closes
// it, so nothing of the host's stays open for the command.
func TestJoinCgroups(t *testing.T) {
	dir := t.TempDir()
	var fds []int
	for _, name := range []string{"memory", "pids"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Dup(int(f.Fd()))
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	if err := joinCgroups(fds); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"memory", "pids"} {
		if got, _ := os.ReadFile(filepath.Join(dir, name)); string(got) != "0" {
			t.Errorf("%s: %q, want \"0\"", name, got)
		}
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			t.Errorf("descriptor %d still open", fd)
		}
	}
	r, w, _ := os.Pipe()
	defer w.Close()
	rfd, _ := unix.Dup(int(r.Fd()))
	r.Close()
	if err := joinCgroups([]int{rfd}); err == nil {
		t.Error("joined through a file it cannot write")
	}
}

// reap returns the command's status, however it ends, and passes the
// signals init receives on to it.
func TestReap(t *testing.T) {
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	defer signal.Stop(chld)
	start := func(script string) int {
		pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	if ws := reap(start("exit 3"), nil, chld); !ws.Exited() || ws.ExitStatus() != 3 {
		t.Errorf("exit 3: status %#x", ws)
	}
	// The command's own orphan is reaped too, before or after it.
	if ws := reap(start("sh -c 'exit 1' & exit 0"), nil, chld); ws.ExitStatus() != 0 {
		t.Errorf("with an orphan: status %#x", ws)
	}
	sigs := make(chan os.Signal, 1)
	sigs <- unix.SIGTERM
	if ws := reap(start("exec sleep 600"), sigs, chld); !ws.Signaled() || ws.Signal() != unix.SIGTERM {
		t.Errorf("passed SIGTERM: status %#x", ws)
	}
}
