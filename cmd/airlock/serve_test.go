package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/nettest"
)

// testKey is the servers' API key in these tests.
const testKey = "e2b_test_0123456789abcdef0123456789abcdef"

// server is a running airlock serve.
type server struct {
	cmd      *exec.Cmd
	url, key string
	stateDir string
	client   *http.Client
}

func startServe(t *testing.T, stateDir string, args ...string) *server {
	t.Helper()
	return startServeIn(t, nil, stateDir, args...)
}

// startServeIn starts airlock serve in the lab's host namespace (nil: the
// test's own), and talks to it there.
func startServeIn(t *testing.T, lab *nettest.Lab, stateDir string, args ...string) *server {
	t.Helper()
	return startServeKey(t, lab, testKey, stateDir, args...)
}

// startServeKey is startServeIn with the API key key.
func startServeKey(t *testing.T, lab *nettest.Lab, key, stateDir string, args ...string) *server {
	t.Helper()
	airlocktest.RequiresRoot(t)
	if lab == nil {
		args = sealed(t, args)
	}
	cmd := exec.Command(airlockBin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", stateDir}, args...)...)
	cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY="+key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd.Stderr = &logs
	start, client := cmd.Start, http.DefaultClient
	if lab != nil {
		start = func() error { return nettest.Do(lab.Host, cmd.Start) }
		client = &http.Client{Transport: &http.Transport{DialContext: lab.DialContext}}
	}
	if err := start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, key: key, stateDir: stateDir, client: client}
	// A test that fails before it stops its server (or kills it) must not
	// leave it running, nor its sandboxes.
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "E2B_API_URL="); ok {
			s.url = v
			break
		}
	}
	if s.url == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("airlock serve did not start: %s", logs.String())
	}
	go io.Copy(io.Discard, out)
	return s
}

// sealed returns serve's args with a config that seals the server
// (network.default "none"), merged into the --config they name, if any.
// A server outside a lab of the test's own gives its sandboxes no
// network, so that nothing a test runs in them can leave the host.
func sealed(t *testing.T, args []string) []string {
	t.Helper()
	args = slices.Clone(args)
	cfg := map[string]any{}
	at := slices.Index(args, "--config")
	if at >= 0 {
		data, err := os.ReadFile(args[at+1])
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &cfg); err != nil {
			t.Fatal(err)
		}
	}
	network, _ := cfg["network"].(map[string]any)
	if network == nil {
		network = map[string]any{}
	}
	if _, set := network["default"]; !set {
		network["default"] = "none"
	}
	cfg["network"] = network
	data, _ := json.Marshal(cfg)
	path := filepath.Join(t.TempDir(), "sealed.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if at >= 0 {
		args[at+1] = path
		return args
	}
	return append([]string{"--config", path}, args...)
}

// stop ends the server with SIGTERM and checks it leaves nothing behind.
func (s *server) stop(t *testing.T) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.cmd.Wait(); err != nil {
		t.Errorf("airlock serve exited with %v after SIGTERM", err)
	}
	airlocktest.CheckNoLeftovers(t, filepath.Join(s.stateDir, "run"))
}

func (s *server) do(t *testing.T, method, path string, body any, hdr map[string]string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

type created struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

func (s *server) create(t *testing.T) created {
	t.Helper()
	code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, map[string]string{"X-API-KEY": s.key})
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var c created
	json.Unmarshal(body, &c)
	return c
}

func sandboxHeaders(c created, token string) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": c.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
}

// run runs a shell command in the sandbox through the gateway and
// returns its stdout; the stream must end with its end of stream, without
// an error.
func (s *server) run(t *testing.T, c created, script string) string {
	t.Helper()
	return s.runAs(t, c, "", script)
}

// runAs is run as user ("": the default), as envd names it.
func (s *server) runAs(t *testing.T, c created, user, script string) string {
	t.Helper()
	hdr := http.Header{}
	for k, v := range sandboxHeaders(c, c.EnvdAccessToken) {
		hdr.Set(k, v)
	}
	if user != "" {
		hdr.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	agent := &agentproto.Client{Transport: s.client.Transport, URL: s.url, Header: hdr}
	if agent.Transport == nil {
		agent.Transport = http.DefaultTransport
	}
	req := agentproto.StartRequest{Process: &agentproto.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}}
	var stdout []byte
	for m, err := range agentproto.Stream[agentproto.StartResponse](t.Context(), agent, agentproto.StartProcedure, req, 0) {
		if err != nil {
			t.Fatalf("run %q: %v", script, err)
		}
		if m.Event != nil && m.Event.Data != nil {
			stdout = append(stdout, m.Event.Data.Stdout...)
		}
	}
	return string(stdout)
}

func TestServeAuthAndRouting(t *testing.T) {
	s := startServe(t, t.TempDir(), "--pool-size", "1")
	defer s.stop(t)
	key := map[string]string{"X-API-KEY": s.key}
	a, b, gone := s.create(t), s.create(t), s.create(t)
	if code, body := s.do(t, "DELETE", "/sandboxes/"+gone.SandboxID, nil, key); code != 204 {
		t.Fatalf("kill: %d %s", code, body)
	}
	for _, tc := range []struct {
		name         string
		method, path string
		body         any
		hdr          map[string]string
		want         int
	}{
		{"no API key", "GET", "/v2/sandboxes", nil, nil, 401},
		{"wrong API key", "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": "e2b_wrong"}, 401},
		{"list", "GET", "/v2/sandboxes", nil, key, 200},
		{"unknown sandbox", "GET", "/sandboxes/inope", nil, key, 404},
		{"unknown template", "POST", "/v2/sandboxes", map[string]any{"templateID": "nope"}, key, 400},
		{"a field not implemented", "POST", "/v2/sandboxes", map[string]any{"volumeMounts": []any{map[string]string{"name": "v", "path": "/data"}}}, key, 400},
		{"bad timeout", "POST", "/v2/sandboxes", map[string]any{"timeout": -5}, key, 400},
		{"bad json", "POST", "/v2/sandboxes", "{", key, 400},
		{"own token", "GET", "/health", nil, sandboxHeaders(a, a.EnvdAccessToken), 204},
		{"no token", "GET", "/health", nil, sandboxHeaders(a, ""), 401},
		{"other sandbox's token", "GET", "/health", nil, sandboxHeaders(a, b.EnvdAccessToken), 401},
		{"gone sandbox, its token", "GET", "/health", nil, sandboxHeaders(gone, gone.EnvdAccessToken), 502},
		// A gone sandbox and an unknown id answer as a live one does to a
		// wrong token: ids cannot be probed.
		{"gone sandbox, another's token", "GET", "/health", nil, sandboxHeaders(gone, a.EnvdAccessToken), 401},
		{"unknown sandbox, a guessed token", "GET", "/health", nil, sandboxHeaders(created{SandboxID: "inope"}, "x"), 401},
		{"private agent path", "POST", "/airlock/setup", map[string]any{"envVars": map[string]string{"X": "1"}}, sandboxHeaders(a, a.EnvdAccessToken), 404},
		{"a port nothing listens on", "GET", "/health", nil, map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": "8080", "X-Access-Token": a.EnvdAccessToken}, 502},
		{"interpreter port", "GET", "/health", nil, map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": a.EnvdAccessToken}, 200},
		{"daemon health", "GET", "/health", nil, nil, 200},
		{"metrics without the key", "GET", "/metrics", nil, nil, 401},
		{"metrics", "GET", "/metrics", nil, key, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := s.do(t, tc.method, tc.path, tc.body, tc.hdr)
			if code != tc.want {
				t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
			}
			if strings.Contains(string(body), s.stateDir) || strings.Contains(string(body), ".sock") {
				t.Errorf("response leaks host paths: %s", body)
			}
		})
	}
	_, metrics := s.do(t, "GET", "/metrics", nil, key)
	for _, m := range []string{`airlock_sandboxes_running{template="base"} 2`, "airlock_sandbox_create_seconds_bucket", "airlock_pool_ready"} {
		if !strings.Contains(string(metrics), m) {
			t.Errorf("metrics lack %q:\n%s", m, metrics)
		}
	}
}

// TestServeHostFilesUnreachable: a path that climbs out, or a symlink the
// sandbox plants towards a host file, resolves inside the sandbox.
func TestServeHostFilesUnreachable(t *testing.T) {
	secret := filepath.Join(os.TempDir(), fmt.Sprintf("airlock-host-secret-%d", os.Getpid()))
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(secret)
	s := startServe(t, t.TempDir(), "--pool-size", "0")
	defer s.stop(t)
	c := s.create(t)
	if out := s.run(t, c, "ln -s "+secret+" /home/user/link; ln -s / /home/user/root; echo ok"); out != "ok\n" {
		t.Fatalf("planting symlinks: %q", out)
	}
	for _, p := range []string{"/home/user/link", "/home/user/root" + secret, "../../.." + secret, secret} {
		code, body := s.do(t, "GET", "/files?path="+p, nil, sandboxHeaders(c, c.EnvdAccessToken))
		if strings.Contains(string(body), "host secret") {
			t.Errorf("GET /files?path=%s returned the host's file", p)
		}
		if code != 404 {
			t.Errorf("GET /files?path=%s: %d %s, want 404", p, code, body)
		}
	}
}

// TestServeCrashRecovery: after kill -9 of the daemon its sandboxes die
// with it, and the next start removes what they left.
// killWhileRunning starts a daemon on dir with a pool and a working
// sandbox (paused, if asked), lists what the sandboxes hold in state (a
// directory of locks or bundles), and SIGKILLs the daemon. What the
// killed daemon left (gVisor's mounts among it) only a start on dir
// removes: if the test fails, one more start is made for that.
func killWhileRunning(t *testing.T, dir, state string, paused bool, args ...string) []os.DirEntry {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			startServe(t, dir, append(args, "--pool-size", "0")...).stop(t)
		}
	})
	s := startServe(t, dir, append(args, "--pool-size", "1")...)
	c := s.create(t)
	if out := s.run(t, c, "echo alive"); out != "alive\n" {
		t.Fatalf("sandbox not working: %q", out)
	}
	if paused {
		if code, body := s.do(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", nil, map[string]string{"X-API-KEY": s.key}); code != 204 {
			t.Fatalf("pause: %d %s", code, body)
		}
	}
	held, _ := os.ReadDir(state)
	if len(held) == 0 {
		t.Fatalf("nothing in %s while sandboxes ran", state)
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	return held
}

func TestServeCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "run", "runs")
	before := killWhileRunning(t, dir, runs, false)
	for deadline := time.Now().Add(10 * time.Second); len(airlocktest.SandboxProcs()) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox processes outlived the daemon: %v", airlocktest.SandboxProcs())
		}
	}
	s2 := startServe(t, dir, "--pool-size", "0")
	for _, e := range before {
		if _, err := os.Stat(filepath.Join(runs, e.Name())); err == nil {
			t.Errorf("run lock %s survived the restart", e.Name())
		}
		if m, _ := filepath.Glob("/sys/fs/cgroup/*/airlock-" + e.Name()); len(m) > 0 {
			t.Errorf("cgroups of the killed daemon's sandbox survived the restart: %v", m)
		}
	}
	s2.stop(t)
}

// A gVisor sandbox dies with the daemon too: runsc run is the daemon's
// child (Pdeathsig), the sandbox runsc's. The next start removes the rest.
func TestServeCrashRecoveryGVisor(t *testing.T) {
	airlocktest.RequiresRoot(t)
	if _, err := exec.LookPath("runsc"); err != nil && os.Getenv("AIRLOCK_RUNSC") == "" {
		t.Skip("no runsc (make test builds it)")
	}
	dir := t.TempDir()
	bundles := filepath.Join(dir, "gvisor", "bundles")
	before := killWhileRunning(t, dir, bundles, false, "--backend", "gvisor")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, _ := exec.Command("pgrep", "-f", "runsc-sandbox.*"+dir).Output()
		if len(out) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gVisor sandboxes outlived the daemon: %s", out)
		}
	}
	s2 := startServe(t, dir, "--backend", "gvisor", "--pool-size", "0")
	if left, _ := os.ReadDir(bundles); len(left) > 0 {
		t.Errorf("%d bundles survived the restart", len(left))
	}
	for _, e := range before {
		if m, _ := filepath.Glob("/sys/fs/cgroup/*/airlock-" + e.Name()); len(m) > 0 {
			t.Errorf("cgroups of the killed daemon's sandbox survived the restart: %v", m)
		}
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), dir) {
		t.Errorf("mounts under %s survived the restart", dir)
	}
	s2.stop(t)
}

// A sandbox paused when the daemon dies (frozen: on cgroup v1 not even
// SIGKILL ends it) is removed by the next start, on either backend.
func TestServeCrashWhilePaused(t *testing.T) {
	airlocktest.RequiresRoot(t)
	airlocktest.RequiresFreezer(t)
	for _, backend := range []string{"namespaces", "gvisor"} {
		t.Run(backend, func(t *testing.T) {
			if _, err := exec.LookPath("runsc"); backend == "gvisor" && err != nil && os.Getenv("AIRLOCK_RUNSC") == "" {
				t.Skip("no runsc (make test builds it)")
			}
			dir := t.TempDir()
			state := map[string]string{"namespaces": filepath.Join(dir, "run", "runs"), "gvisor": filepath.Join(dir, "gvisor", "bundles")}[backend]
			before := killWhileRunning(t, dir, state, true, "--backend", backend)
			s2 := startServe(t, dir, "--backend", backend, "--pool-size", "0")
			// On gVisor the paused sandbox was saved to disk: its bundle
			// (no process, no cgroup, no mount) outlives the daemon, to be
			// restored (tests/e2b/persistence.test.mjs); the pooled one goes.
			want := map[string]int{"namespaces": 0, "gvisor": 1}[backend]
			if left, _ := os.ReadDir(state); len(left) != want {
				t.Errorf("%d sandboxes' state survived the restart, want %d", len(left), want)
			}
			if backend == "gvisor" {
				if saved, _ := filepath.Glob(filepath.Join(state, "*", "saved")); len(saved) != 1 {
					t.Errorf("the paused sandbox was not kept saved: %v", saved)
				}
			}
			for _, e := range before {
				if m, _ := filepath.Glob("/sys/fs/cgroup/*/airlock-" + e.Name()); len(m) > 0 {
					t.Errorf("cgroups of the paused sandbox survived the restart: %v", m)
				}
			}
			// Killed ones are reaped by the host's init, a moment later.
			for deadline := time.Now().Add(10 * time.Second); len(airlocktest.SandboxProcs()) > 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("sandbox processes survived the restart: %v", airlocktest.SandboxProcs())
				}
			}
			if out, _ := exec.Command("pgrep", "-f", "runsc-sandbox.*"+dir).Output(); len(out) > 0 {
				t.Errorf("gVisor sandboxes survived the restart: %s", out)
			}
			s2.stop(t)
		})
	}
}

// A paused sandbox still holds its memory: it is removed when the
// server's longest time to live has passed.
func TestServePausedSandboxEndsAtMaxTimeout(t *testing.T) {
	airlocktest.RequiresRoot(t)
	airlocktest.RequiresFreezer(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "airlock.json")
	os.WriteFile(cfg, []byte(`{"defaultTimeout": "2s", "maxTimeout": "6s", "templates": {"code-interpreter-v1": {"poolSize": 0}}}`), 0o644)
	s := startServe(t, filepath.Join(dir, "state"), "--config", cfg)
	key := map[string]string{"X-API-KEY": s.key}
	c := s.create(t)
	if code, body := s.do(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", nil, key); code != 204 {
		t.Fatalf("pause: %d %s", code, body)
	}
	// Past its own 2 s time to live it is still there, paused ...
	time.Sleep(3 * time.Second)
	code, body := s.do(t, "GET", "/sandboxes/"+c.SandboxID, nil, key)
	if code != 200 || !strings.Contains(string(body), `"state":"paused"`) {
		t.Fatalf("paused sandbox after 3 s: %d %s", code, body)
	}
	// ... and gone once the 6 s maximum has passed.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code, _ := s.do(t, "GET", "/sandboxes/"+c.SandboxID, nil, key); code == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the paused sandbox outlived the server's maxTimeout")
		}
	}
	s.stop(t)
}

func TestServeBadConfig(t *testing.T) {
	airlocktest.RequiresRoot(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "airlock.json")
	for _, tc := range []struct {
		config string
		args   []string
		want   string
	}{
		{`{"templates": {"gpu": {}}}`, nil, `unknown template "gpu"`},
		{`{"templates": {"base": {"memory": "0"}}}`, nil, "memory limit 0 is below"},
		{`{"defaultTimeout": "soon"}`, nil, `invalid duration "soon"`},
		{`{"listne": "x"}`, nil, `unknown field "listne"`},
		{`{}`, []string{"--listen", "256.0.0.1:1"}, "listen on 256.0.0.1:1"},
		{`{"templates": {"base": {"poolSize": -1}}}`, nil, "pool size -1 is out of range"},
		{`{}`, []string{"extra"}, `unexpected argument "extra"`},
		{`{"network": {"subnet": "ten"}}`, nil, `network.subnet "ten" is not a CIDR prefix`},
		{`{"network": {"subnet": "10.0.0.0/30"}}`, nil, "a /30 per sandbox"},
		{`{"network": {"dns": ["resolver"]}}`, nil, `DNS upstream "resolver"`},
		{`{"network": {"connections": -1}}`, nil, "must not be negative"},
		{`{"network": {"bandwidth": "fast"}}`, nil, `size "fast"`},
		{`{"builds": {"registryAddresses": ["registry.local"]}}`, nil, `builds.registryAddresses: "registry.local" is not an IP address`},
	} {
		os.WriteFile(cfg, []byte(tc.config), 0o644)
		// Port 0: should a case not fail, it must not take a real port.
		args := append([]string{"serve", "--config", cfg, "--state-dir", dir, "--listen", "127.0.0.1:0"}, tc.args...)
		r := airlockWithin(t, 10*time.Second, args...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != 2 || len(lines) != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("config %s %v: exit %d stderr %q, want 2 and one line with %q", tc.config, tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// airlockWithin runs airlock and kills it if it has not exited after d:
// a server that was expected to refuse its config must not hang the test.
func airlockWithin(t *testing.T, d time.Duration, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(airlockBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(d, func() { cmd.Process.Signal(syscall.SIGTERM) })
	defer timer.Stop()
	cmd.Wait()
	return cliResult{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// TestServeBackendPerRequest: where the server allows it, a create request
// picks gVisor; elsewhere asking is refused.
func TestServeBackendPerRequest(t *testing.T) {
	airlocktest.RequiresRoot(t)
	if _, err := exec.LookPath("runsc"); err != nil && os.Getenv("AIRLOCK_RUNSC") == "" {
		t.Skip("no runsc (make test builds it)")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "airlock.json")
	os.WriteFile(cfg, []byte(`{"allowRequestBackend": true, "templates": {"base": {"poolSize": 1}, "code-interpreter-v1": {"poolSize": 0}}}`), 0o644)
	s := startServe(t, filepath.Join(dir, "state"), "--config", cfg)
	key := map[string]string{"X-API-KEY": s.key}
	for backend, want := range map[string]string{"gvisor": "gvisor", "": "fc", "namespaces": "fc"} {
		code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "backend": backend}, key)
		if code != 201 {
			t.Fatalf("create with backend %q: %d %s", backend, code, body)
		}
		var c created
		json.Unmarshal(body, &c)
		release := s.run(t, c, "uname -r")
		if onGVisor := strings.Contains(release, "gvisor"); onGVisor != (want == "gvisor") {
			t.Errorf("backend %q: kernel %q", backend, release)
		}
	}
	if code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"backend": "vmware"}, key); code != 400 {
		t.Errorf("unknown backend: %d %s", code, body)
	}
	s.stop(t)

	s = startServe(t, filepath.Join(dir, "state2"), "--pool-size", "0")
	defer s.stop(t)
	if code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"backend": "gvisor"}, key); code != 400 || !strings.Contains(string(body), "does not let a request choose") {
		t.Errorf("backend asked of a server that does not allow it: %d %s", code, body)
	}
}

// TestServeMaxSandboxesUnderConcurrency starts more sandboxes at once
// than the limit allows: exactly the limit succeed, the rest get 429.
func TestServeMaxSandboxesUnderConcurrency(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "airlock.json")
	os.WriteFile(cfg, []byte(`{"maxSandboxes": 3}`), 0o644)
	s := startServe(t, filepath.Join(dir, "state"), "--config", cfg, "--pool-size", "0")
	defer s.stop(t)
	const n = 8
	codes := make(chan int, n)
	for range n {
		go func() { // not s.do: t.Fatal belongs to the test's goroutine
			req, _ := http.NewRequest("POST", s.url+"/v2/sandboxes", strings.NewReader(`{"templateID": "base"}`))
			req.Header.Set("X-API-KEY", s.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	count := map[int]int{}
	for range n {
		count[<-codes]++
	}
	if count[201] != 3 || count[429] != n-3 {
		t.Errorf("statuses %v, want 3 × 201 and %d × 429", count, n-3)
	}
}

func TestMCPBadInput(t *testing.T) {
	airlocktest.RequiresRoot(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--timeout", "0s"}, "timeout must be positive"},
		{[]string{"--pool-size", "5000"}, "pool size 5000 is out of range"},
		{[]string{"--state-dir", "relative"}, `state directory "relative" is not an absolute path`},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--backend", "vm"}, `unknown backend "vm"`},
		{[]string{"--backend", "gvisor", "--runsc", "/bin/ls"}, "dynamically linked"},
	} {
		args := append([]string{"mcp", "--state-dir", dir}, tc.args...)
		r := airlockWithin(t, 10*time.Second, args...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != 2 || len(lines) != 1 || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("mcp %v: exit %d stdout %q stderr %q, want 2 and one line with %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
}

// TestServeConnectionLimits: with the config's idleTimeout and
// maxConnections, an idle keep-alive connection is closed, and a
// connection past the bound waits until another closes.
func TestServeConnectionLimits(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config.json")
	if err := os.WriteFile(config, []byte(`{"idleTimeout": "1s", "maxConnections": 2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, filepath.Join(dir, "state"), "--pool-size", "0", "--config", config)
	defer s.stop(t)
	addr := strings.TrimPrefix(s.url, "http://")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	idle := dial()
	br := bufio.NewReader(idle)
	fmt.Fprint(idle, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	io.CopyN(io.Discard, br, int64(len("ok\n")))
	idle.SetReadDeadline(time.Now().Add(time.Minute)) // eventually; a minute only stops a hang
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("an idle keep-alive connection: read %v, want EOF (closed by the server)", err)
	}

	// Two connections that have sent nothing yet hold both places.
	held := []net.Conn{dial(), dial()}
	extra := dial()
	fmt.Fprint(extra, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	br = bufio.NewReader(extra)
	extra.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection while two are held: read %v, want no answer yet", err)
	}
	held[0].Close()
	extra.SetReadDeadline(time.Now().Add(time.Minute))
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("once one closed: %v %v, want an answer", resp, err)
	}
}
