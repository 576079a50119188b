package backend

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// AwaitExit returns when the child ends, not before, and leaves it to
// Wait to reap; meanwhile it holds no thread of the process.
func TestAwaitExit(t *testing.T) {
	threads := func() int {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "Threads:"); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
		return 0
	}
	fds := func() int {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}
	var cmds []*exec.Cmd
	done := make(chan struct{}, 50)
	if _, err := exitWatch(); err != nil { // its thread and epoll instance, counted before
		t.Fatal(err)
	}
	before, beforeFDs := threads(), fds()
	for range 50 {
		// Each waits on a pipe this test holds open.
		cmd := exec.Command("/bin/sh", "-c", "read x")
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = r
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		t.Cleanup(func() { w.Close() })
		cmds = append(cmds, cmd)
		go func() {
			AwaitExit(cmd.Process)
			done <- struct{}{}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("AwaitExit returned while the child ran")
	default:
	}
	if n := threads(); n > before+10 {
		t.Errorf("%d threads while 50 children are awaited, %d before", n, before)
	}
	// Each child's pipe and os.Process's pidfd, nothing more.
	if n := fds(); n > beforeFDs+2*50 {
		t.Errorf("%d descriptors while 50 children are awaited, %d before", n, beforeFDs)
	}
	for _, cmd := range cmds {
		cmd.Process.Kill()
	}
	for range cmds {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("AwaitExit did not return after the child ended")
		}
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err == nil || cmd.ProcessState == nil || cmd.ProcessState.Exited() {
			t.Errorf("Wait after AwaitExit: %v, %v: want the kill's status", err, cmd.ProcessState)
		}
	}
}
