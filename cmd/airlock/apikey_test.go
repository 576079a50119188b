package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/apikey"
)

// openPty returns a pseudo-terminal's two ends.
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// announced starts airlock serve on stateDir with env added, its stdout
// a terminal if tty, and returns what it printed on stdout up to
// E2B_SANDBOX_URL; the server is stopped then.
func announced(t *testing.T, stateDir string, tty bool, env ...string) string {
	t.Helper()
	airlocktest.RequiresRoot(t)
	cmd := exec.Command(airlockBin, "serve", "--listen", "127.0.0.1:0", "--state-dir", stateDir, "--pool-size", "0")
	cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY=")
	cmd.Env = append(cmd.Env, env...)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	var out *os.File
	if tty {
		m, s := openPty(t)
		cmd.Stdout, out = s, m
	} else {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		cmd.Stdout, out = w, r
		defer w.Close()
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if f, ok := cmd.Stdout.(*os.File); ok {
		f.Close() // the child has its own copy: the reader sees its end
	}
	var printed strings.Builder
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r") // a terminal's line ends
		printed.WriteString(line + "\n")
		if strings.HasPrefix(line, "E2B_SANDBOX_URL=") {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("airlock serve: %v\n%s", err, logs.String())
	}
	if !strings.Contains(printed.String(), "E2B_SANDBOX_URL=") {
		t.Fatalf("airlock serve did not start; printed %q\n%s", printed.String(), logs.String())
	}
	for _, secret := range env {
		if _, k, _ := strings.Cut(secret, "="); k != "" && strings.Contains(logs.String(), k) {
			t.Errorf("the server's log shows the key:\n%s", logs.String())
		}
	}
	return printed.String()
}

// TestServeAPIKeyPrinting: the key is printed only when this start made
// it and stdout is a terminal; otherwise where it is and its
// fingerprint, so that it never lands in a log.
func TestServeAPIKeyPrinting(t *testing.T) {
	t.Run("from AIRLOCK_API_KEY", func(t *testing.T) {
		for _, tty := range []bool{false, true} {
			out := announced(t, t.TempDir(), tty, "AIRLOCK_API_KEY="+testKey)
			if strings.Contains(out, testKey) {
				t.Errorf("tty %v: the key from the environment was printed:\n%s", tty, out)
			}
			if want := "# E2B_API_KEY is the key in AIRLOCK_API_KEY (" + apikey.Fingerprint(testKey) + ")"; !strings.Contains(out, want) {
				t.Errorf("tty %v: printed\n%s\nwant the line %q", tty, out, want)
			}
		}
	})
	t.Run("generated, to a terminal", func(t *testing.T) {
		dir := t.TempDir()
		out := announced(t, dir, true)
		stored, err := os.ReadFile(filepath.Join(dir, "api-key"))
		if err != nil {
			t.Fatal(err)
		}
		key := strings.TrimSpace(string(stored))
		if !strings.Contains(out, "E2B_API_KEY="+key+"\n") {
			t.Errorf("a key made by this start, to a terminal: printed\n%s\nwant E2B_API_KEY=%s", out, key)
		}
		// The next start did not make it: it is not printed again.
		out = announced(t, dir, true)
		if strings.Contains(out, key) || !strings.Contains(out, "# E2B_API_KEY is the key in "+filepath.Join(dir, "api-key")+" ("+apikey.Fingerprint(key)+")") {
			t.Errorf("the stored key, second start: printed\n%s", out)
		}
	})
	t.Run("generated, to a pipe", func(t *testing.T) {
		dir := t.TempDir()
		out := announced(t, dir, false)
		stored, err := os.ReadFile(filepath.Join(dir, "api-key"))
		if err != nil {
			t.Fatal(err)
		}
		key := strings.TrimSpace(string(stored))
		if strings.Contains(out, key) || !strings.Contains(out, "# E2B_API_KEY is the key in "+filepath.Join(dir, "api-key")) {
			t.Errorf("a key made by this start, to a pipe: printed\n%s", out)
		}
	})
}

// TestServeRefusesWeakKeys: a weak key is refused with one line saying
// what a key needs, before anything starts.
func TestServeRefusesWeakKeys(t *testing.T) {
	airlocktest.RequiresRoot(t)
	for _, k := range []string{"e2b_test_key", "changeme", strings.Repeat("x", 40)} {
		dir := t.TempDir()
		cmd := exec.Command(airlockBin, "serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--pool-size", "0")
		cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY="+k)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != 2 {
			t.Errorf("key %q: exit code %d, want 2 (%s)", k, code, stderr.String())
		}
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "AIRLOCK_API_KEY is too weak: an API key needs at least 32 characters") || strings.Contains(lines[0], k) {
			t.Errorf("key %q: stderr %q, want one line saying what a key needs", k, stderr.String())
		}
	}
	// The router shares the nodes' key: the same rule.
	router := exec.Command(airlockBin, "router", "--listen", "127.0.0.1:0")
	router.Env = append(os.Environ(), "AIRLOCK_API_KEY=changeme")
	if out, _ := router.CombinedOutput(); router.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "AIRLOCK_API_KEY is too weak") {
		t.Errorf("router with a weak key: exit %d, %q", router.ProcessState.ExitCode(), out)
	}
	// A weak key stored by hand is refused too.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "api-key"), []byte("hunter2\n"), 0o600)
	cmd := exec.Command(airlockBin, "serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--pool-size", "0")
	cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY=")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "too weak") || strings.Contains(string(out), "hunter2") {
		t.Errorf("a weak stored key: exit %d, %q", cmd.ProcessState.ExitCode(), out)
	}
}

// TestServeTokensOutliveKeyRotation: sandboxes' tokens come from a secret
// of the state directory, not from the API key: a token says nothing
// about the key, and a server restarted with another key still knows
// the tokens it issued (a gone sandbox's token gets 502, not 401).
func TestServeTokensOutliveKeyRotation(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, dir, "--pool-size", "0")
	c := s.create(t)
	if code, body := s.do(t, "DELETE", "/sandboxes/"+c.SandboxID, nil, map[string]string{"X-API-KEY": s.key}); code != 204 {
		t.Fatalf("kill: %d %s", code, body)
	}
	s.stop(t)
	fi, err := os.Stat(filepath.Join(dir, "token-key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the token key: %v %v, want a file of mode 0600", fi, err)
	}

	rotated := "e2b_rotated_fedcba9876543210fedcba9876543210"
	s = startServeKey(t, nil, rotated, dir, "--pool-size", "0")
	defer s.stop(t)
	if code, body := s.do(t, "GET", "/health", nil, sandboxHeaders(c, c.EnvdAccessToken)); code != 502 {
		t.Errorf("a gone sandbox's token after the key changed: %d %s, want 502 (a token this server issued)", code, body)
	}
	if code, _ := s.do(t, "GET", "/health", nil, sandboxHeaders(c, "0"+c.EnvdAccessToken[1:])); code != 401 && c.EnvdAccessToken[0] != '0' {
		t.Errorf("a wrong token: %d, want 401", code)
	}
	if code, _ := s.do(t, "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": testKey}); code != 401 {
		t.Errorf("the old key after rotation: %d, want 401", code)
	}
}
