package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// benchServer is an airlock serve of airlock bench's own, in a state
// directory of its own, whose base is the host's view (stock.root
// "jail"): what airlock run --daemon takes its sandboxes from.
type benchServer struct {
	dir, url, key string
	cmd           *exec.Cmd
}

// benchPool is its pool's size. The server is sealed (network.default
// "none"): its pool keeps sandboxes without a network alone, those
// airlock run takes.
const benchPool = 2

func startBenchServer(self string) (*benchServer, error) {
	dir, err := os.MkdirTemp("", "airlock-bench-serve-")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := fmt.Sprintf(`{"listen": %q, "network": {"default": "none"}, "stock": {"root": "jail"}, "templates": {"base": {"poolSize": %d}, "code-interpreter-v1": {"poolSize": 0}}}`, addr, benchPool)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &benchServer{dir: filepath.Join(dir, "state"), url: "http://" + addr}
	s.cmd = exec.Command(self, "serve", "--config", filepath.Join(dir, "config.json"), "--state-dir", s.dir)
	s.cmd.Stderr, _ = os.Create(filepath.Join(dir, "serve.log"))
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		if key, err := os.ReadFile(filepath.Join(s.dir, "api-key")); err == nil {
			s.key = strings.TrimSpace(string(key))
			if err := s.settle(); err == nil {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("bench: airlock serve did not fill its pool in a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settle waits until the pool is full and no sandbox runs.
func (s *benchServer) settle() error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		ready, running, err := s.counts()
		if err == nil && ready >= benchPool && running == 0 {
			return nil
		}
	}
	return errors.New("bench: the daemon's pool did not refill in 30 s")
}

// counts reads base's ready and running sandboxes from the metrics.
func (s *benchServer) counts() (ready, running int, err error) {
	req, _ := http.NewRequest(http.MethodGet, s.url+"/metrics", nil)
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		for prefix, dst := range map[string]*int{`airlock_pool_ready{template="base"} `: &ready, `airlock_sandboxes_running{template="base"} `: &running} {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				fmt.Sscan(v, dst)
			}
		}
	}
	return ready, running, sc.Err()
}

func (s *benchServer) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	s.cmd.Wait()
	os.RemoveAll(filepath.Dir(s.dir))
}
