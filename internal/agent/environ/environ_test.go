package environ

import (
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
)

func TestFor(t *testing.T) {
	e := New([]string{"PATH=/bin", "X=base", "broken", "HOME=/home/user", "USER=user", "EMPTY="})
	if got, want := e.For(nil), []string{"EMPTY=", "HOME=/home/user", "PATH=/bin", "USER=user", "X=base"}; !slices.Equal(got, want) {
		t.Errorf("the base alone: %q, want %q", got, want)
	}
	e.Set(map[string]string{"X": "sandbox", "Y": "1"})
	e.Set(map[string]string{"Z": "2"}) // adds, keeps what was set
	got := e.For(map[string]string{"Y": "request", "W": "w=x"})
	want := []string{"EMPTY=", "HOME=/home/user", "PATH=/bin", "USER=user", "W=w=x", "X=sandbox", "Y=request", "Z=2"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q: the request over the sandbox over the base", got, want)
	}
}

func TestForID(t *testing.T) {
	e := New([]string{"HOME=/home/user", "USER=user", "LOGNAME=user", "PATH=/bin"})
	if got, want := e.ForID(identity.Root, nil), []string{"HOME=/root", "LOGNAME=root", "PATH=/bin", "USER=root"}; !slices.Equal(got, want) {
		t.Errorf("root's: %q, want %q", got, want)
	}
	if got, want := e.ForID(identity.User, map[string]string{"HOME": "/elsewhere"}), []string{"HOME=/elsewhere", "LOGNAME=user", "PATH=/bin", "USER=user"}; !slices.Equal(got, want) {
		t.Errorf("the user's: %q, want %q", got, want)
	}
	app := identity.ID{Name: "app", UID: 1500, GID: 1500, Home: "/home/app"}
	if got, want := e.ForID(app, nil), []string{"HOME=/home/app", "LOGNAME=app", "PATH=/bin", "USER=app"}; !slices.Equal(got, want) {
		t.Errorf("an image's user's: %q, want %q", got, want)
	}
}

// TestConcurrentSet: the sandbox's envs arrive while processes start.
func TestConcurrentSet(t *testing.T) {
	e := New(nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { e.Set(map[string]string{"V" + strconv.Itoa(i): "x"}) })
		wg.Go(func() { e.For(nil) })
	}
	wg.Wait()
	if got := e.For(nil); len(got) != 8 {
		t.Errorf("got %q, want the 8 variables set", got)
	}
}
