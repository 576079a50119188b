package process

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/environ"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

// These tests serve the service in-process, as the test's user, with a
// temporary home: its wire protocol without a sandbox around it.

// newService serves a new service whose user's home is a temporary
// directory.
func newService(t *testing.T) (s *Service, url, home string) {
	t.Helper()
	home = t.TempDir()
	s = New(identity.Users{Home: home}, environ.New(os.Environ()))
	mux := http.NewServeMux()
	s.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return s, srv.URL, home
}

// event is one message of a process stream; exactly one field is set.
type event struct {
	Event struct {
		Start *struct {
			Pid uint32 `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
			Pty    []byte `json:"pty"`
		} `json:"data"`
		End *struct {
			ExitCode int32   `json:"exitCode"`
			Exited   bool    `json:"exited"`
			Status   string  `json:"status"`
			Error    *string `json:"error"`
		} `json:"end"`
		Keepalive *struct{} `json:"keepalive"`
	} `json:"event"`
}

// run is what a process stream reported.
type run struct {
	pid                 uint32
	stdout, stderr, pty string
	exitCode            int32
	exited              bool
	status              string
	endErr              *string
}

// startProcess starts a process and returns the stream, its start event
// read.
func startProcess(t *testing.T, url string, req map[string]any, user string, hdr ...string) (*rpctest.Stream, uint32) {
	t.Helper()
	s := rpctest.OpenStream(t, url, "process.Process/Start", req, user, hdr...)
	var ev event
	more, err := s.Next(&ev)
	if !more {
		t.Fatalf("Start %v: stream ended at once: %v", req, err)
	}
	if ev.Event.Start == nil || ev.Event.Start.Pid == 0 {
		t.Fatalf("Start %v: first event %+v, want start with a pid", req, ev.Event)
	}
	return s, ev.Event.Start.Pid
}

// finish reads s to its end, which must carry no error.
func finish(t *testing.T, s *rpctest.Stream, pid uint32) run {
	t.Helper()
	r := run{pid: pid}
	ended := false
	for {
		var ev event
		more, err := s.Next(&ev)
		if !more {
			if err != nil {
				t.Fatalf("stream error %s", err)
			}
			break
		}
		switch e := ev.Event; {
		case e.Data != nil:
			r.stdout += string(e.Data.Stdout)
			r.stderr += string(e.Data.Stderr)
			r.pty += string(e.Data.Pty)
		case e.End != nil:
			ended = true
			r.exitCode, r.exited, r.status, r.endErr = e.End.ExitCode, e.End.Exited, e.End.Status, e.End.Error
		}
	}
	if !ended {
		t.Fatal("the stream ended without an end event")
	}
	return r
}

func command(cmd string, args ...string) map[string]any {
	return map[string]any{"process": map[string]any{"cmd": cmd, "args": args}}
}

// sleeper starts a process that waits until it is signalled.
func sleeper(t *testing.T, url, tag string) (*rpctest.Stream, uint32) {
	t.Helper()
	req := command("/bin/sleep", "60")
	req["tag"] = tag
	s, pid := startProcess(t, url, req, "")
	t.Cleanup(func() { syscall.Kill(int(pid), syscall.SIGKILL) }) // should the test fail first
	return s, pid
}

// TestSelect: a process is found by pid or tag; selecting none, or one
// that is not there, says which.
func TestSelect(t *testing.T) {
	s, url, _ := newService(t)
	_, pid := sleeper(t, url, "found")
	tag, other, none := "found", "other", uint32(1<<30)
	for _, tc := range []struct {
		sel  *selector
		err  string
		want uint32
	}{
		{&selector{Pid: &pid}, "", pid},
		{&selector{Tag: &tag}, "", pid},
		{&selector{Pid: &none}, "not_found: process with pid 1073741824 not found", 0},
		{&selector{Tag: &other}, `not_found: process with tag "other" not found`, 0},
		{&selector{}, "invalid_argument: no process selected", 0},
		{nil, "invalid_argument: no process selected", 0},
	} {
		p, err := s.find(tc.sel)
		switch {
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%+v: got %v, want %s", tc.sel, err, tc.err)
		case tc.err == "" && (err != nil || p.info.Pid != tc.want):
			t.Errorf("%+v: got %v, want pid %d", tc.sel, err, tc.want)
		}
	}
}

// Close kills every process the service started, with its group: an
// agent that outlives its sandbox (the fake backend's) leaves nothing.
func TestCloseKillsEveryProcess(t *testing.T) {
	s, url, _ := newService(t)
	stream, pid := startProcess(t, url, command("/bin/sh", "-c", "sleep 600 & echo started; wait"), "")
	var ev event
	for {
		if more, err := stream.Next(&ev); !more {
			t.Fatalf("the stream ended before the process wrote: %v", err)
		}
		if ev.Event.Data != nil {
			break
		}
	}
	s.Close()
	r := finish(t, stream, pid)
	if r.exitCode == 0 || !strings.Contains(r.status, "killed") {
		t.Errorf("after Close: %+v, want the process killed", r)
	}
	if left := liveInGroup(int(pid)); len(left) > 0 {
		t.Errorf("processes of the group of %d are still running: %v", pid, left)
	}
}

// liveInGroup lists the processes of process group pgid that are neither
// zombies (a killed child waits for init to reap it) nor on their way
// out (SIGKILL pending: the kill has been sent, not yet acted on).
func liveInGroup(pgid int) []string {
	var live []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces.
		_, rest, _ := strings.Cut(string(data), ") ")
		fields := strings.Fields(rest)
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) && fields[0] != "Z" && !killPending(filepath.Dir(f)) {
			live = append(live, f)
		}
	}
	return live
}

// killPending reports whether the process at /proc/PID dir has SIGKILL
// pending, for itself or its thread group.
func killPending(dir string) bool {
	status, _ := os.ReadFile(filepath.Join(dir, "status"))
	for line := range strings.Lines(string(status)) {
		k, v, _ := strings.Cut(line, ":")
		if k != "SigPnd" && k != "ShdPnd" {
			continue
		}
		if bits, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && bits&(1<<(9-1)) != 0 {
			return true
		}
	}
	return false
}
