package sudo

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sudo's options as the client reads them and the command it asks for.
// (Running one needs a sandbox with a root: tests/e2b/template.test.mjs.)
func TestSudoOptions(t *testing.T) {
	passwdFile = filepath.Join(t.TempDir(), "passwd")
	t.Cleanup(func() { passwdFile = "/etc/passwd" })
	os.WriteFile(passwdFile, []byte("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644)
	t.Setenv("SHELL", "/bin/bash")
	caller := "user"
	if os.Getuid() == 0 {
		caller = "root"
	}
	t.Setenv("MINE", "x")
	for _, tc := range []struct {
		args []string
		argv []string // the command the agent is asked to run
		user string
		env  []string // in the request's environment
		not  []string // variables it must not have
		err  string
	}{
		{args: []string{"id", "-u"}, argv: []string{"id", "-u"}, user: "root",
			env: []string{"USER=root", "HOME=/root", "SUDO_USER=" + caller, "PATH=" + securePath}, not: []string{"MINE"}},
		{args: []string{"-nE", "env"}, argv: []string{"env"}, user: "root", env: []string{"MINE=x", "USER=root"}},
		{args: []string{"--preserve-env=MINE", "env"}, argv: []string{"env"}, user: "root", env: []string{"MINE=x"}},
		{args: []string{"-uuser", "id"}, argv: []string{"id"}, user: "user"},
		{args: []string{"-u", "#0", "--", "-weird"}, argv: []string{"-weird"}, user: "root"},
		{args: []string{"A=1", "B=two words", "env"}, argv: []string{"env"}, user: "root", env: []string{"A=1", "B=two words"}},
		{args: []string{"-i"}, argv: []string{"/bin/bash", "-l"}, user: "root"},
		{args: []string{"-i", "echo", "a b;c"}, argv: []string{"/bin/bash", "-l", "-c", `echo a\ b\;c`}, user: "root"},
		{args: []string{"-s", "echo", "$HOME"}, argv: []string{"/bin/bash", "-c", `echo $HOME`}, user: "root"},
		{args: []string{}, err: "no command"},
		{args: []string{"-u"}, err: "requires an argument"},
		{args: []string{"-g", "wheel", "id"}, err: "option -g is not supported"},
		{args: []string{"--askpass", "id"}, err: "option --askpass is not supported"},
		{args: []string{"-u", "mallory", "id"}, err: "unknown user mallory"},
		{args: []string{"-i", "-s"}, err: "only one of -i and -s"},
	} {
		o, err := parse(tc.args)
		var req *request
		if err == nil {
			req, err = o.request()
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("sudo %q: %v, want an error with %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("sudo %q: %v", tc.args, err)
			continue
		}
		if !slices.Equal(req.Argv, tc.argv) || req.User != tc.user {
			t.Errorf("sudo %q: runs %q as %s, want %q as %s", tc.args, req.Argv, req.User, tc.argv, tc.user)
		}
		for _, kv := range tc.env {
			if !slices.Contains(req.Env, kv) {
				t.Errorf("sudo %q: environment %q lacks %s", tc.args, req.Env, kv)
			}
		}
		for _, k := range tc.not {
			if slices.ContainsFunc(req.Env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") }) {
				t.Errorf("sudo %q: environment %q has %s", tc.args, req.Env, k)
			}
		}
	}
}

func TestSudoModes(t *testing.T) {
	for args, mode := range map[string]string{"-h": "help", "-V": "version", "-v": "validate", "-k": "validate", "-l": "list", "--list": "list"} {
		o, err := parse([]string{args})
		if err != nil || o.mode != mode {
			t.Errorf("sudo %s: %+v %v, want mode %s", args, o, err, mode)
		}
	}
}
