package gvisor

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// processState is how a real process ended that ran script.
func processState(t *testing.T, script string) *os.ProcessState {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Run()
	if cmd.ProcessState == nil {
		t.Fatalf("%q did not run", script)
	}
	return cmd.ProcessState
}

// said is a runscFailure whose runsc has exited, having said msg.
func said(msg string) *runscFailure {
	f := &runscFailure{done: make(chan struct{}), msg: msg}
	close(f.done)
	return f
}

// How runsc run's exit becomes the container's: 128+N is signal N, 128
// with a message is runsc's own failure, a timeout is SIGKILL.
func TestRunExit(t *testing.T) {
	for _, tc := range []struct {
		script   string
		timedOut bool
		failure  string
		code     int
		signal   string
		err      string
	}{
		{"exit 0", false, "", 0, "", ""},
		{"exit 3", false, "", 3, "", ""},
		{"exit 137", false, "", -1, "SIGKILL", ""},
		{"exit 143", false, "", -1, "SIGTERM", ""},
		{"exit 139", false, "", -1, "SIGSEGV", ""},
		{"exit 200", false, "", 200, "", ""}, // not a signal's
		{"exit 128", false, "", 128, "", ""},
		{"exit 128", false, "creating container: bad bundle", 0, "", "runsc: creating container: bad bundle"},
		// A message with a status that is the container's is not runsc's failure.
		{"exit 3", false, "some warning", 3, "", ""},
		{"exit 0", true, "", -1, "SIGKILL", ""},
		{"kill -9 $$", true, "", -1, "SIGKILL", ""},
		{"kill -9 $$", false, "", 0, "", "runsc was killed"},
	} {
		code, signal, err := runExit(processState(t, tc.script), tc.timedOut, said(tc.failure))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q timed out %v failure %q: err %v, want %q", tc.script, tc.timedOut, tc.failure, err, tc.err)
			}
			continue
		}
		if err != nil || code != tc.code || signal != tc.signal {
			t.Errorf("%q timed out %v failure %q: %d %q %v, want %d %q", tc.script, tc.timedOut, tc.failure, code, signal, err, tc.code, tc.signal)
		}
	}
}

// runsc's log: the first message is its failure, whatever follows, and
// a log that is no JSON, or too long, is drained without one.
func TestRunscFailure(t *testing.T) {
	for _, tc := range []struct {
		log, want string
	}{
		{`{"msg":"first","level":"error"}` + "\n" + `{"msg":"second"}` + "\n", "first"},
		{`{"level":"info"}` + "\n" + `{"msg":"later"}` + "\n", "later"},
		{"not json\n" + `{"msg":"after garbage"}`, ""},
		{"", ""},
		{strings.Repeat(" ", 70<<10) + `{"msg":"past the limit"}`, ""},
	} {
		f := &runscFailure{}
		w, err := f.pipe()
		if err != nil {
			t.Fatal(err)
		}
		w.WriteString(tc.log)
		w.Close()
		<-f.done
		if got := f.wait(); got != tc.want {
			t.Errorf("log %.40q: %q, want %q", tc.log, got, tc.want)
		}
	}
}
