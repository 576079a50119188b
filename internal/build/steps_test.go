package build

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// newState is a build's state at its start, on a fakeAgent, logging into
// logs.
func newState(t *testing.T, files *Files) (*state, *fakeAgent, *[]string) {
	t.Helper()
	agent := &fakeAgent{}
	var logs []string
	st := &state{box: &fakeBox{agent: agent}, env: []string{"PATH=/usr/bin:/bin"}, user: layout.User, workdir: layout.Home,
		files: files, log: func(level, msg string) { logs = append(logs, level+": "+msg) }}
	return st, agent, &logs
}

func step(t *testing.T, st *state, typ string, args ...string) error {
	t.Helper()
	return st.step(t.Context(), &Step{Type: typ, Args: args})
}

// TestSteps: RUN runs /bin/sh -c in the working directory with the
// environment, as the step's user; ENV, WORKDIR and USER change what
// later steps get, and WORKDIR makes its directory for that user.
func TestSteps(t *testing.T) {
	st, agent, logs := newState(t, nil)
	for _, s := range [][]string{
		{"RUN", "echo one"},
		{"ENV", "A", "1", "PATH", "/opt/bin:/usr/bin"},
		{"WORKDIR", "app"},
		{"RUN", "make", "root"},
		{"USER", "root"},
		{"WORKDIR", "/srv/data/"},
		{"RUN", "ls"},
	} {
		if err := step(t, st, s[0], s[1:]...); err != nil {
			t.Fatalf("%v: %v", s, err)
		}
	}
	env := map[string]string{"A": "1", "PATH": "/opt/bin:/usr/bin"}
	want := []call{
		{user: "user", cmd: "/bin/sh -c echo one", cwd: "/home/user", envs: map[string]string{"PATH": "/usr/bin:/bin"}},
		{dir: "/home/user/app", onlyNew: true, entries: []entry{{".", layout.UID, layout.GID, 0o755, tar.TypeDir, ""}}},
		{user: "root", cmd: "/bin/sh -c make", cwd: "/home/user/app", envs: env},
		{dir: "/srv/data", onlyNew: true, entries: []entry{{".", 0, 0, 0o755, tar.TypeDir, ""}}},
		{user: "root", cmd: "/bin/sh -c ls", cwd: "/srv/data", envs: env},
	}
	if got := agent.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("the agent was asked:\n%+v\nwant:\n%+v", got, want)
	}
	if got := strings.Join(*logs, "|"); got != "info: ran echo one|info: ran make|info: ran ls" {
		t.Errorf("the log: %s", got)
	}
	if st.user != "root" || st.workdir != "/srv/data" {
		t.Errorf("the state after the steps: user %s, workdir %s", st.user, st.workdir)
	}
}

// TestRunFails: a command that exits non-zero fails its step, naming the
// code and the command; its output is in the log, a line at a time.
func TestRunFails(t *testing.T) {
	st, agent, logs := newState(t, nil)
	agent.exit = func(cmd string) (int, string) { return 3, "first\r\nsecond\npartial" }
	err := step(t, st, "RUN", "make test")
	if err == nil || err.Error() != "the command exited with code 3: make test" {
		t.Errorf("a failing RUN: %v", err)
	}
	if got := strings.Join(*logs, "|"); got != "info: first|info: second|info: partial" {
		t.Errorf("the log: %q", got)
	}
}

func TestOwner(t *testing.T) {
	for _, tc := range []struct {
		user, def string
		uid, gid  int
		ok        bool
	}{
		{"root", "", 0, 0, true},
		{"user", "", layout.UID, layout.GID, true},
		{"", "user", layout.UID, layout.GID, true},
		{"", "root", 0, 0, true},
		{"1234", "", 1234, 1234, true},
		{"1234:50", "", 1234, 50, true},
		{"65535:65535", "", 65535, 65535, true},
		{"65536", "", 0, 0, false},
		{"nobody", "", 0, 0, false},
		{"1:x", "", 0, 0, false},
		{"-1", "", 0, 0, false},
	} {
		uid, gid, err := owner(tc.user, tc.def)
		if (err == nil) != tc.ok || tc.ok && (uid != tc.uid || gid != tc.gid) {
			t.Errorf("owner(%q, %q) = %d:%d, %v", tc.user, tc.def, uid, gid, err)
		}
	}
}

// upload stores a tar of files as a COPY's upload and returns its hash.
func upload(t *testing.T, f *Files, files ...string) string {
	t.Helper()
	data := tarFile(files...)
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	if err := f.Put(hash, strings.NewReader(string(data))); err != nil {
		t.Fatal(err)
	}
	return hash
}

// TestCopy: COPY lays out the upload's entries as Docker's COPY does,
// owned by the step's user (or the one it names), with its mode if it
// gives one.
func TestCopy(t *testing.T) {
	files, err := OpenFiles(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	hash := upload(t, files, "app/", "", "app/main.py", "print(1)", "app/lib/x.py", "x", "notes.txt", "n")
	st, agent, _ := newState(t, files)
	for _, tc := range []struct {
		args []string
		want []entry
	}{
		{[]string{"app", "/srv/"}, []entry{
			{"srv", layout.UID, layout.GID, 0o755, tar.TypeDir, ""},
			{"srv/main.py", layout.UID, layout.GID, 0o600, tar.TypeReg, "print(1)"},
			{"srv/lib/x.py", layout.UID, layout.GID, 0o600, tar.TypeReg, "x"}}},
		{[]string{"notes.txt", "docs/", "root", "644"}, []entry{
			{"home/user/docs/notes.txt", 0, 0, 0o644, tar.TypeReg, "n"}}},
		{[]string{"notes.txt", "/etc/motd", "1000:5"}, []entry{
			{"etc/motd", 1000, 5, 0o600, tar.TypeReg, "n"}}},
	} {
		if err := st.step(t.Context(), &Step{Type: "COPY", Args: tc.args, FilesHash: hash}); err != nil {
			t.Fatalf("COPY %v: %v", tc.args, err)
		}
		got := agent.take()
		if len(got) != 1 || got[0].dir != "/" || got[0].onlyNew || !reflect.DeepEqual(got[0].entries, tc.want) {
			t.Errorf("COPY %v sent %+v, want %+v", tc.args, got, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		hash string
		want string
	}{
		{[]string{"missing", "/x"}, hash, "the upload has nothing at missing"},
		{[]string{"app", "/x"}, strings.Repeat("0", 64), fmt.Sprintf("the files of this COPY (%s) were not uploaded", strings.Repeat("0", 64))},
	} {
		err := st.step(t.Context(), &Step{Type: "COPY", Args: tc.args, FilesHash: tc.hash})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("COPY %v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
