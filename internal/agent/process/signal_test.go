package process

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

func TestSendSignal(t *testing.T) {
	_, url, _ := newService(t)
	for _, tc := range []struct{ signal, status string }{
		{"SIGNAL_SIGKILL", "signal: killed"}, {"9", "signal: killed"},
		{"SIGNAL_SIGTERM", "signal: terminated"}, {"15", "signal: terminated"},
	} {
		t.Run(tc.signal, func(t *testing.T) {
			s, pid := sleeper(t, url, "")
			rpctest.MustUnary(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": pid}, "signal": tc.signal}, nil)
			if r := finish(t, s, pid); r.exited || r.status != tc.status || r.endErr == nil {
				t.Errorf("got %+v, want %s", r, tc.status)
			}
		})
	}
}

// TestSendSignalReachesTheGroup: what the process started is signalled
// with it.
func TestSendSignalReachesTheGroup(t *testing.T) {
	_, url, _ := newService(t)
	s, pid := startProcess(t, url, command("/bin/sh", "-c", "sleep 60 & echo $!; wait"), "")
	var ev event
	if more, _ := s.Next(&ev); !more || ev.Event.Data == nil {
		t.Fatalf("got %+v, want the child's pid", ev.Event)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(ev.Event.Data.Stdout)))
	if err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(child, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	rpctest.MustUnary(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": pid}, "signal": "SIGNAL_SIGTERM"}, nil)
	finish(t, s, pid)
	// A pidfd reads ready once its process has ended: no waiting on the
	// clock for it, only a bound on how long.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 10_000)
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Poll(fds, 10_000)
	}
	if err != nil || n != 1 {
		unix.Kill(child, unix.SIGKILL)
		t.Errorf("the child %d outlived its group's signal (poll: %d, %v)", child, n, err)
	}
}

func TestSendSignalRefused(t *testing.T) {
	_, url, _ := newService(t)
	_, pid := sleeper(t, url, "")
	sel := map[string]any{"pid": pid}
	rpctest.WantError(t, url, "process.Process/SendSignal", map[string]any{"process": sel, "signal": "SIGNAL_SIGHUP"}, "invalid_argument", 400)
	rpctest.WantError(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": pid + 1<<20}, "signal": "SIGNAL_SIGKILL"}, "not_found", 404)
	rpctest.WantError(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{}, "signal": "SIGNAL_SIGKILL"}, "invalid_argument", 400)
}
