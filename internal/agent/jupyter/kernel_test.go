package jupyter

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStart: the kernel process gets its connection file (a key, five
// loopback ports, HMAC-SHA256), the files asked for in its own
// directory, its arguments with {dir} and {connection_file} replaced,
// its environment and working directory; it is connected to over TCP,
// runs cells, and Kill ends it and removes its directory. The kernel is
// this test binary, as a fake kernel (TestMain).
func TestStart(t *testing.T) {
	out, cwd := t.TempDir(), t.TempDir()
	spec := &Spec{Argv: []string{os.Args[0], "{connection_file}", "{dir}/zero"}, Language: "fake", Env: map[string]string{"FROM_SPEC": "spec"}}
	k, err := Start(t.Context(), spec, Options{
		Cwd: cwd, Env: []string{"FROM_OPTS=opts", "AIRLOCK_FAKE_KERNEL=" + out}, Files: map[string][]byte{"extra.txt": []byte("extra")},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Kill()
	var raw map[string]any
	data, _ := os.ReadFile(filepath.Join(out, "conn.json"))
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("connection file %q: %v", data, err)
	}
	ports := map[float64]bool{}
	for _, k := range []string{"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"} {
		if p, ok := raw[k].(float64); ok && p > 0 {
			ports[p] = true
		}
	}
	if key, _ := raw["key"].(string); raw["ip"] != "127.0.0.1" || raw["transport"] != "tcp" || raw["signature_scheme"] != "hmac-sha256" || len(key) < 32 || len(ports) != 5 {
		t.Errorf("connection file %s", data)
	}
	read := func(name string) string {
		data, _ := os.ReadFile(filepath.Join(out, name))
		return string(data)
	}
	if read("extra.txt") != "extra" || read("env") != "spec opts" || read("pwd") != cwd || read("arg") != filepath.Join(k.dir, "zero") {
		t.Errorf("extra %q, env %q, pwd %q, arg %q", read("extra.txt"), read("env"), read("pwd"), read("arg"))
	}
	var outputs []string
	if err := k.Execute(t.Context(), "x", func(o Output) { outputs = append(outputs, o.Type) }); err != nil || len(outputs) != 4 {
		t.Errorf("a cell over TCP: %v, %v", outputs, err)
	}
	dir := k.dir
	k.Kill()
	<-k.Done()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the kernel's directory after Kill: %v", err)
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Errorf("ports %v: want five distinct ones", ports)
		}
		seen[p] = true
	}
}

// TestRealKernel: Python's kernel, where it is installed: it starts,
// runs a cell, is interrupted in a long one and killed.
// realKernel starts the host's Python kernel for t, or skips t.
func realKernel(t *testing.T) *Kernel {
	t.Helper()
	spec, err := FindSpec("python3", "python")
	if err != nil {
		t.Skip("no Python kernel is installed (make deps installs it)")
	}
	k, err := Start(t.Context(), spec, Options{Cwd: t.TempDir(), Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Kill)
	return k
}

func TestRealKernel(t *testing.T) {
	k := realKernel(t)
	var result string
	err := k.Execute(t.Context(), "6*7", func(o Output) {
		if o.Type == "execute_result" {
			var c struct {
				Data map[string]string `json:"data"`
			}
			json.Unmarshal(o.Content, &c)
			result = c.Data["text/plain"]
		}
	})
	if err != nil || result != "42" {
		t.Errorf("6*7: %q, %v", result, err)
	}
	started := make(chan struct{})
	var ename string
	go func() {
		<-started
		k.Interrupt()
	}()
	// Interrupted once it runs: a SIGINT before, as the cell starts, is
	// ipykernel's to ignore.
	err = k.Execute(t.Context(), "import time\nprint('running', flush=True)\ntime.sleep(60)", func(o Output) {
		switch o.Type {
		case "stream":
			close(started)
		case "error":
			var c struct{ Ename string }
			json.Unmarshal(o.Content, &c)
			ename = c.Ename
		}
	})
	if err != nil || ename != "KeyboardInterrupt" {
		t.Errorf("interrupted: %q, %v", ename, err)
	}
	if !k.WaitIdle(30 * time.Second) {
		t.Error("the kernel did not come back after the interrupt")
	}
	dir := k.dir
	k.Kill()
	<-k.Done()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the kernel's directory after Kill: %v", err)
	}
}

// TestCellAfterErrorRuns: a cell sent at once after a failed one runs,
// every time: ipykernel aborts what reaches it just after an error's
// reply unless cells are sent with stop_on_error false.
func TestCellAfterErrorRuns(t *testing.T) {
	k := realKernel(t)
	for i := range 30 {
		if err := k.Execute(t.Context(), "1 / 0", func(Output) {}); err != nil {
			t.Fatal(err)
		}
		status := ""
		err := k.Execute(t.Context(), "1 + 1", func(o Output) {
			if o.Type == "execute_reply" {
				var c struct{ Status string }
				json.Unmarshal(o.Content, &c)
				status = c.Status
			}
		})
		if err != nil || status != "ok" {
			t.Fatalf("cell %d after an error: status %q, %v", i, status, err)
		}
	}
}
