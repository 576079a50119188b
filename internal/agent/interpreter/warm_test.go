package interpreter

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

func post(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSettleWithoutPrestart: nothing to wait for.
func TestSettleWithoutPrestart(t *testing.T) {
	_, _, envd := newService(t)
	if code := post(t, envd+agentproto.SettlePath); code != http.StatusNoContent {
		t.Errorf("settle: %d", code)
	}
	if code := post(t, envd+agentproto.ReseedPath); code != http.StatusNoContent {
		t.Errorf("reseed without kernels: %d", code)
	}
}

// TestPrestartFails: a kernel that cannot start leaves the agent
// settled, and the default context to the first execution.
func TestPrestartFails(t *testing.T) {
	s, _, envd := newService(t)
	s.Prestart("cobol")
	if code := post(t, envd+agentproto.SettlePath); code != http.StatusNoContent {
		t.Errorf("settle: %d", code)
	}
	if len(s.contexts) != 0 {
		t.Errorf("contexts %v", s.contexts)
	}
}

// TestPrestartAndReseed: settle answers once the prestarted kernel is
// the default context; reseed gives its generators new seeds.
func TestPrestartAndReseed(t *testing.T) {
	needKernel(t, "python")
	s, url, envd := newService(t)
	s.Prestart("python")
	if code := post(t, envd+agentproto.SettlePath); code != http.StatusNoContent {
		t.Fatalf("settle: %d", code)
	}
	s.mu.Lock()
	_, ok := s.defaults["python"]
	s.mu.Unlock()
	if !ok {
		t.Fatal("settled without python's default context")
	}
	// A clone's kernel has the saved one's generator state: here, a seed
	// all clones would share.
	seeded := "import random\nrandom.seed(7)\nrandom.random()"
	_, want := text(execute(t, url, agentproto.ExecuteRequest{Code: seeded}))
	if _, err := strconv.ParseFloat(want, 64); err != nil {
		t.Fatalf("seeded: %q", want)
	}
	execute(t, url, agentproto.ExecuteRequest{Code: "random.seed(7)"})
	if code := post(t, envd+agentproto.ReseedPath); code != http.StatusNoContent {
		t.Fatalf("reseed: %d", code)
	}
	if _, got := text(execute(t, url, agentproto.ExecuteRequest{Code: "random.random()"})); got == want {
		t.Errorf("after reseed, the seeded generator's next number %s again", got)
	}
}

// TestWarmLate: the late kernels start when the daemon says so, in the
// background, and once.
func TestWarmLate(t *testing.T) {
	needKernel(t, "python")
	s, _, envd := newService(t)
	s.PrestartLate([]string{"python"})
	s.mu.Lock()
	started := len(s.contexts)
	s.mu.Unlock()
	if started != 0 {
		t.Fatalf("%d kernels before the daemon said so", started)
	}
	for range 2 {
		if code := post(t, envd+agentproto.WarmLatePath); code != http.StatusNoContent {
			t.Fatalf("warm-late: %d", code)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		s.mu.Lock()
		_, ok := s.defaults["python"]
		n := len(s.contexts)
		s.mu.Unlock()
		if ok {
			if n != 1 {
				t.Errorf("%d kernels, want the one default", n)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the late kernel never started")
		}
	}
}
