package backendtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// A crash, for real: the suite runs its own test binary as a child
// process (the crash helper), which starts a box in the suite's state
// directory and says so; the suite kills it with SIGKILL, so that nothing
// of it runs a deferred function, and then Cleanup must remove all the
// child's box left.

// crashHelperEnv names the helper's state directory in its environment.
const crashHelperEnv = "AIRLOCK_CONFORMANCE_CRASH"

// crashReady is the helper's line once its box runs.
const crashReady = "airlock-conformance: box running"

// crashHelper is Conformance in the child: start a box, say so, wait to
// be killed. Should the suite die first, the end of the helper's stdin
// closes, and the box goes as it should.
func crashHelper(t *testing.T, target Target, dir string) {
	inst, err := target.New(dir).Start(context.Background(), TestPolicy(), nil)
	if err != nil {
		t.Fatalf("crash helper: Start: %v", err)
	}
	defer func() {
		inst.Kill(context.Background())
		inst.Wait()
	}()
	if err := health(t.Context(), inst); err != nil {
		t.Fatalf("crash helper: %v", err)
	}
	fmt.Println(crashReady)
	io.Copy(io.Discard, os.Stdin)
}

func (s *suite) crashCleanup(t *testing.T) {
	s.claims(t, "cleanup after a crash", s.CrashCleanup)
	top, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+regexp.QuoteMeta(top)+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashHelperEnv+"="+s.stateDir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Written by exec's copier of stderr and by the loop below.
	var said lockedBuffer
	cmd.Stderr = &said
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	ready := false
	for !ready && sc.Scan() {
		ready = sc.Text() == crashReady
		fmt.Fprintln(&said, sc.Text())
	}
	// The crash: no deferred function, no cleanup of its own.
	cmd.Process.Kill()
	cmd.Wait()
	if !ready {
		t.Fatalf("the crash helper never started its box:\n%s", said.String())
	}
	left := s.Leftovers(s.stateDir)
	if len(left) == 0 {
		t.Fatal("the killed process left nothing Leftovers lists: the check below could not fail")
	}
	if err := s.be.Cleanup(t.Context()); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	gone(t, "after the crash's Cleanup", left)
	s.noLeftovers(t, "after the crash's Cleanup")
}

// lockedBuffer is a bytes.Buffer that two goroutines may write.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
