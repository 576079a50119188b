package sudo

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/airlocktest"
)

// socketpair returns the two ends of a new connected unix socket, which
// the kernel records as made by the calling thread's user.
func socketpair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// socketpairAs is socketpair made on a thread acting as id: each end's
// peer is id, as SO_PEERCRED reports it.
func socketpairAs(t *testing.T, id identity.ID) (a, b *net.UnixConn) {
	t.Helper()
	airlocktest.RequiresRoot(t)
	if err := identity.OnThreadAs(id, func() error { a, b = socketpair(t); return nil }); err != nil {
		t.Fatal(err)
	}
	return a, b
}

var nobody = identity.ID{Name: "nobody", UID: 65534, GID: 65534}

// TestPeerUID: the kernel's record of who made the other end, not who
// uses it now.
func TestPeerUID(t *testing.T) {
	a, b := socketpair(t)
	for _, c := range []*net.UnixConn{a, b} {
		if uid, err := peerUID(c); err != nil || uid != os.Geteuid() {
			t.Errorf("a socketpair of this process: peer %d, %v; want %d", uid, err, os.Geteuid())
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	a, b = socketpairAs(t, nobody)
	for _, c := range []*net.UnixConn{a, b} {
		if uid, err := peerUID(c); err != nil || uid != nobody.UID {
			t.Errorf("a socketpair made as nobody: peer %d, %v; want %d", uid, err, nobody.UID)
		}
	}
}

func TestPeerUIDOfAClosedConn(t *testing.T) {
	a, _ := socketpair(t)
	a.Close()
	if _, err := peerUID(a); err == nil {
		t.Error("a closed connection's peer was read")
	}
}
