package process

import (
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

type listed struct {
	Processes []struct {
		Pid    uint32 `json:"pid"`
		Tag    string `json:"tag"`
		Config struct {
			Cmd  string   `json:"cmd"`
			Args []string `json:"args"`
		} `json:"config"`
	} `json:"processes"`
}

func TestList(t *testing.T) {
	_, url, _ := newService(t)
	var l listed
	rpctest.MustUnary(t, url, "process.Process/List", map[string]any{}, &l)
	if len(l.Processes) != 0 {
		t.Fatalf("List of a new service: %+v, want none", l)
	}
	s, pid := sleeper(t, url, "sleeper")
	rpctest.MustUnary(t, url, "process.Process/List", map[string]any{}, &l)
	if len(l.Processes) != 1 || l.Processes[0].Pid != pid || l.Processes[0].Tag != "sleeper" ||
		l.Processes[0].Config.Cmd != "/bin/sleep" || !slices.Equal(l.Processes[0].Config.Args, []string{"60"}) {
		t.Fatalf("List: %+v, want the sleeper", l)
	}
	rpctest.MustUnary(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": pid}, "signal": "SIGNAL_SIGKILL"}, nil)
	finish(t, s, pid)
	l = listed{}
	rpctest.MustUnary(t, url, "process.Process/List", map[string]any{}, &l)
	if len(l.Processes) != 0 {
		t.Errorf("List after the end: %+v, want none", l)
	}
}
