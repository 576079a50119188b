package tasks

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestMain runs the test binary as a helper where a test starts it
// (TASKS_HELPER set): an agent whose RLIMIT_NPROC its parent set, which
// starts a shell that reports its own.
func TestMain(m *testing.M) {
	if os.Getenv("TASKS_HELPER") != "" {
		os.Exit(helper())
	}
	os.Exit(m.Run())
}

// helper starts a shell with Start and prints the limits it got, then
// the helper's own after.
func helper() int {
	cmd := exec.Command("/bin/bash", "-c", "ulimit -S -u; ulimit -H -u")
	var out strings.Builder
	cmd.Stdout = &out
	if err := Start(cmd); err != nil {
		fmt.Println("start:", err)
		return 1
	}
	if err := cmd.Wait(); err != nil {
		fmt.Println("wait:", err)
		return 1
	}
	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NPROC, &rl)
	fmt.Printf("%safter %d %d\n", out.String(), rl.Cur, rl.Max)
	return 0
}

// runHelper runs the helper with RLIMIT_NPROC soft and hard (as the
// backends start the agent) and returns what it printed.
func runHelper(t *testing.T, soft, hard int) string {
	t.Helper()
	script := fmt.Sprintf(`ulimit -S -u %d && ulimit -H -u %d && exec "$0"`, soft, hard)
	cmd := exec.Command("/bin/bash", "-c", script, os.Args[0])
	cmd.Env = append(os.Environ(), "TASKS_HELPER=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	return string(out)
}

// TestStartKeepsTheReserve: a child gets the agent's soft limit less
// AgentTasks, the hard one unchanged; the agent's own is as before.
func TestStartKeepsTheReserve(t *testing.T) {
	got := runHelper(t, 1000, 2000)
	want := fmt.Sprintf("%d\n2000\nafter 1000 2000\n", 1000-agentproto.AgentTasks)
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestStartWithoutAReserve: where the agent's limit leaves no reserve
// (or there is none), the child gets the agent's limit as it is.
func TestStartWithoutAReserve(t *testing.T) {
	small := 2 * agentproto.AgentTasks
	if got, want := runHelper(t, small, 500), fmt.Sprintf("%d\n500\nafter %d 500\n", small, small); got != want {
		t.Errorf("a limit of %d: got %q, want %q", small, got, want)
	}
}

// TestStartFails: a command that cannot start is Start's error, and the
// agent's limit is back all the same.
func TestStartFails(t *testing.T) {
	before := own
	if err := Start(exec.Command("/no/such/command")); err == nil {
		t.Error("a missing command started")
	}
	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NPROC, &rl)
	if rl != before {
		t.Errorf("the limit after: %+v, want %+v", rl, before)
	}
}
