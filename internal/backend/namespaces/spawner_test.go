package namespaces

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend"
)

// throughSpawner runs the test with inits forked by a spawner process, as
// a daemon's are.
func throughSpawner(t *testing.T) {
	t.Helper()
	forkInit = spawners.fork
	t.Cleanup(func() { forkInit = forkOnThread })
}

// The backend's behaviour, with inits forked by a spawner process: the
// same tests as through this process's own thread.
func TestSpawnerProcess(t *testing.T) {
	airlocktest.RequiresRoot(t)
	throughSpawner(t)
	for name, test := range map[string]func(*testing.T){
		"IdentityAndPrivileges": TestIdentityAndPrivileges,
		"Namespaces":            TestNamespaces,
		"ExitCodesAndSignals":   TestExitCodesAndSignals,
		"Stdin":                 TestStdin,
		"ContextCancelKills":    TestContextCancelKills,
		"StartWithFilesAndSelf": TestStartWithFilesAndSelf,
		"UserNamespaceOwner":    TestUserNamespaceOwner,
		"NoLeakedFiles":         TestNoLeakedFiles,
		"IsolationProperties":   TestIsolationProperties,
	} {
		t.Run(name, test)
	}
}

// Init is the spawner's child, not this process's, and holds none of the
// spawner's descriptors; if the spawner dies, its sandboxes die with it,
// and the next sandbox gets a new spawner.
func TestSpawnerChildrenAndDeath(t *testing.T) {
	airlocktest.RequiresRoot(t)
	throughSpawner(t)
	start := func() *Sandbox {
		t.Helper()
		var out bytes.Buffer
		sb, err := testBackend.start(t.Context(), &spec{Spec: &backend.Spec{Policy: testPolicy(), Argv: []string{"/bin/sleep", "60"}, Stdout: &out, Stderr: &out}})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	sb := start()
	spawnerPid := parentOf(t, sb.proc.Pid())
	if spawnerPid == os.Getpid() {
		t.Fatal("init is this process's child, not the spawner's")
	}
	// Init holds the same descriptors as one this process forks: nothing
	// of the spawner's reaches it.
	forkInit = forkOnThread
	own := start()
	forkInit = spawners.fork
	if got, want := descriptors(t, sb.proc.Pid()), descriptors(t, own.proc.Pid()); got != want {
		t.Errorf("init forked by the spawner holds %s; forked by this process, %s", got, want)
	}
	own.Kill()
	own.Wait()
	if err := syscall.Kill(spawnerPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox outlived its spawner")
	}
	if res, _ := sb.Wait(); res == nil || res.Signal != "SIGKILL" {
		t.Errorf("a sandbox whose spawner died: %+v, want SIGKILL", res)
	}
	again := start()
	if p := parentOf(t, again.proc.Pid()); p == spawnerPid || p == os.Getpid() {
		t.Errorf("after the spawner died, init's parent is %d (the dead spawner %d, or this process)", p, spawnerPid)
	}
	again.Kill()
	again.Wait()
	airlocktest.CheckNoLeftovers(t, DefaultStateDir)
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	ppid, err := strconv.Atoi(statusFields(t, string(status))["PPid"])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// descriptors lists a process's open descriptors and what each is, without
// inode numbers.
func descriptors(t *testing.T, pid int) string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, fd := range fds {
		target, _ := os.Readlink(dir + "/" + fd.Name())
		kind, _, _ := strings.Cut(target, ":[")
		out = append(out, fd.Name()+"="+kind)
	}
	return strings.Join(out, " ")
}
