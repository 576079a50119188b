package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Every runsc call of a sandbox names its own runsc root, its network
// and the platform, and gets none of the daemon's environment.
func TestRunscCommand(t *testing.T) {
	b := &bundle{id: "0123456789abcdef", dir: "/state/bundles/0123456789abcdef", stateDir: "/state"}
	cmd := b.runsc("/bin/runsc", []string{"--log-fd", "3"}, "run", "--bundle", b.dir, b.id)
	want := []string{"/bin/runsc", "--root", "/state/state/0123456789abcdef", "--network", "none", "--platform", "systrap",
		"--log-fd", "3", "run", "--bundle", b.dir, b.id}
	if !slices.Equal(cmd.Args, want) {
		t.Errorf("args %q\nwant %q", cmd.Args, want)
	}
	if !slices.Equal(cmd.Env, runscEnv) || len(runscEnv) != 1 || !strings.HasPrefix(runscEnv[0], "PATH=") {
		t.Errorf("env %q", cmd.Env)
	}
	if got := b.runscArgs(); !slices.Equal(got, want[1:7]) {
		t.Errorf("runscArgs %q", got)
	}
	// A sandbox with a network: gVisor's netstack on its namespace.
	netns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	b.netns = netns
	if got := b.runscArgs(); !slices.Contains(got, "sandbox") || slices.Contains(got, "none") {
		t.Errorf("networked: %q", got)
	}
}

func TestRunFlags(t *testing.T) {
	if f := (&bundle{}).runFlags(); f != nil {
		t.Errorf("host view: %q", f)
	}
	if f := (&bundle{image: true, overlay: 1 << 20}).runFlags(); !slices.Equal(f, []string{"--overlay2=root:memory,size=1048576"}) {
		t.Errorf("image: %q", f)
	}
}

// The writable file systems share the policy's writable bytes: /dev/shm
// a quarter of them, at most 64 MiB, and /tmp and the home (or an image
// root's layer) half of the rest each.
func TestWritableSizes(t *testing.T) {
	for _, tc := range []struct{ mem, disk int64 }{{512 << 20, 1 << 30}, {64 << 20, 8 << 20}, {4 << 30, 16 << 30}, {256 << 20, 1 << 30}} {
		p := policy.Default()
		p.MemoryBytes, p.DiskBytes = tc.mem, tc.disk
		w := p.WritableBytes()
		shm, tmp := shmBytes(&p), tmpfsBytes(&p)
		if shm != min(w/4, 64<<20) {
			t.Errorf("%+v: shm %d", tc, shm)
		}
		if 2*tmp+shm > w || 2*tmp+shm < w-1 {
			t.Errorf("%+v: 2×%d + %d is not the writable %d", tc, tmp, shm, w)
		}
		m := scratchMounts(&p)
		if m[0].Destination != "/tmp" || !slices.Contains(m[0].Options, fmt.Sprintf("size=%d", tmp)) || !slices.Contains(m[0].Options, "mode=1777") {
			t.Errorf("/tmp %+v", m[0])
		}
		if m[1].Destination != "/dev/shm" || !slices.Contains(m[1].Options, fmt.Sprintf("size=%d", shm)) || !slices.Contains(m[1].Options, "noexec") {
			t.Errorf("/dev/shm %+v", m[1])
		}
	}
}

func TestBundlePaths(t *testing.T) {
	b := &bundle{id: "0123456789abcdef", stateDir: "/state"}
	if b.agentDir() != "/state/agents/0123456789abcdef" || b.runscRoot() != "/state/state/0123456789abcdef" {
		t.Errorf("agent %s, runsc root %s", b.agentDir(), b.runscRoot())
	}
	if filepath.Base(b.agentDir()) != b.id {
		t.Error("Cleanup matches agent directories to bundles by name")
	}
}
