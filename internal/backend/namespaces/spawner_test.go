package namespaces

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"golang.org/x/sys/unix"
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

// spawnerParentEnv makes the test binary a daemon that starts a spawner
// and hands its end of the socket to a process of its own (spawnerParent).
const spawnerParentEnv = "AIRLOCK_TEST_SPAWNER_PARENT"

// spawnerParent starts a spawner, then a sleep that holds the daemon's end
// of its socket, prints both pids, and waits to be killed.
func spawnerParent() int {
	sp, err := startSpawner(nil)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	// A fork changes the spawner thread's credentials (asOwner), which
	// clears that thread's parent-death signal: one that fails will do.
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if _, err := sp.fork(&initFork{base: hostIDBase, path: "/nonexistent", stdout: null, stderr: null, cgroupFD: -1}); err == nil {
		fmt.Println("error: a fork of nothing succeeded")
		return 1
	}
	dup, err := unix.FcntlInt(uintptr(sp.sock), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	holder := exec.Command("/bin/sleep", "600")
	holder.ExtraFiles = []*os.File{os.NewFile(uintptr(dup), "socket")}
	if err := holder.Start(); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	// The spawner and the holder are children of some thread of this
	// process: the kernel lists each thread's.
	fmt.Printf("holder %d children of threads:", holder.Process.Pid)
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		c, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		fmt.Printf(" %s", strings.TrimSpace(string(c)))
	}
	fmt.Println()
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// A daemon killed takes its spawner with it, even while another process
// holds the daemon's end of the socket: the parent-death signal alone.
func TestSpawnerDiesWithDaemon(t *testing.T) {
	airlocktest.RequiresRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), spawnerParentEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	var holder int
	var rest string
	if _, err := fmt.Sscanf(line, "holder %d children of threads:", &holder); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the daemon said %q", line)
	}
	defer syscall.Kill(holder, syscall.SIGKILL)
	_, rest, _ = strings.Cut(line, ":")
	var spawnerPid int
	for _, f := range strings.Fields(rest) {
		if pid, _ := strconv.Atoi(f); pid != 0 && pid != holder {
			spawnerPid = pid
		}
	}
	if spawnerPid == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no spawner among the daemon's children: %q", line)
	}
	pidfd, err := unix.PidfdOpen(spawnerPid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	cmd.Process.Kill()
	cmd.Wait()
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, 30_000); n != 1 {
		syscall.Kill(spawnerPid, syscall.SIGKILL)
		t.Fatal("the spawner outlived its daemon")
	}
}
