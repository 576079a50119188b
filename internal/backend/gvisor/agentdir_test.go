package gvisor

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend/backendtest"
)

// hostSocket listens on a unix socket of the host, as a container
// runtime's would, and counts what connects to it: the daemon must never.
func hostSocket(t *testing.T) (path string, accepted *atomic.Int32) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "host.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return path, backendtest.Accepts(t, ln)
}

// health asks the agent behind conn for its health.
func health(conn net.Conn) error {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprint(conn, "GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("health: %s", resp.Status)
	}
	return nil
}

// Whatever a sandbox puts in its agent socket's place in the directory it
// can write (here made on the host, as gVisor's gofer makes it for the
// sandbox), the daemon never connects to anything but the agent's socket,
// and never follows a link: the host socket the link names gets nothing.
func TestAgentSocketSwapsReachNoHostSocket(t *testing.T) {
	be := testBackend(t)
	be.stateDir = t.TempDir()
	inst, err := be.Start(t.Context(), backendtest.TestPolicy(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := inst.(*agentSandbox)
	t.Cleanup(func() {
		s.Kill(t.Context())
		s.Wait()
		if m := airlocktest.MountsUnder(be.stateDir); len(m) > 0 {
			t.Errorf("mounts under the state directory left on the host: %v", m)
		}
	})
	conn, err := s.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := health(conn); err != nil {
		t.Fatal(err)
	}
	target, accepted := hostSocket(t)
	sock := filepath.Join(s.agent.path, agentSocket)
	moved := filepath.Join(s.agent.path, "moved")
	if err := os.Rename(sock, moved); err != nil {
		t.Fatal(err)
	}
	// Another host uid's socket: the sandbox's own making never is.
	other := func(p string) error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: p}); err != nil {
			return err
		}
		return os.Lchown(p, 4242, 4242)
	}
	for _, c := range []struct {
		name string
		make func(p string) error
	}{
		{"a symlink to a host socket", func(p string) error { return os.Symlink(target, p) }},
		{"a symlink through /proc", func(p string) error { return os.Symlink("/proc/self/root"+target, p) }},
		{"a FIFO", func(p string) error { return unix.Mkfifo(p, 0o666) }},
		{"a regular file", func(p string) error { return os.WriteFile(p, nil, 0o666) }},
		{"a directory", func(p string) error { return os.Mkdir(p, 0o777) }},
		{"a device", func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))) }},
		{"a socket of another owner", other},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.make(sock); err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(sock)
			checkSwapRefused(t, s)
		})
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host socket accepted %d connections", n)
	}
	// The agent's own socket, put back, is reached again.
	if err := os.Rename(moved, sock); err != nil {
		t.Fatal(err)
	}
	conn, err = s.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := health(conn); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	// The agent's socket as gVisor's gofer makes it: bound as root, handed
	// to the agent's uid a moment later. A dial in that moment waits.
	var st unix.Stat_t
	if err := unix.Stat(sock, &st); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(sock, 0, 0); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(notAgentGrace / 4)
		os.Lchown(sock, int(st.Uid), int(st.Gid))
	}()
	if conn, err = s.Dial(t.Context()); err != nil {
		t.Fatalf("a dial while the gofer hands the socket over: %v", err)
	}
	if err := health(conn); err != nil {
		t.Fatal(err)
	}
	checkAgentDirBounded(t, be, s)
}

// checkSwapRefused dials s many times at once, as a burst of SDK calls
// does, with something else than the agent's socket in its place.
func checkSwapRefused(t *testing.T, s *agentSandbox) {
	errs := make(chan error, 16)
	for range cap(errs) {
		go func() {
			conn, err := s.Dial(t.Context())
			if err == nil {
				conn.Close()
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; !errors.Is(err, errNotAgentSocket) {
			t.Errorf("Dial = %v, want %v", err, errNotAgentSocket)
		}
	}
	if s.agent.listening() {
		t.Error("listening() took it for the agent's socket")
	}
	if s.agent.absent() {
		t.Error("absent() missed it")
	}
}

// checkAgentDirBounded: the directory is a few inodes of its own: no hard
// link reaches in from the state directory's file system, and filling it
// fills nothing else.
func checkAgentDirBounded(t *testing.T, be *Backend, s *agentSandbox) {
	if err := os.Link(filepath.Join(be.stateDir, "bundles", s.b.id, "config.json"), filepath.Join(s.agent.path, "link")); !errors.Is(err, unix.EXDEV) {
		t.Errorf("hard link into the agent directory: %v, want EXDEV", err)
	}
	var made int
	for ; made < 100; made++ {
		if err := os.WriteFile(filepath.Join(s.agent.path, fmt.Sprint("f", made)), []byte("x"), 0o644); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Errorf("filling the agent directory: %v, want ENOSPC", err)
			}
			break
		}
	}
	if made >= 8 {
		t.Errorf("the agent directory took %d files, want fewer than 8", made)
	}
}

// An agent directory whose bundle is gone (a crash between the two
// removals) is unmounted and removed by the next Cleanup; one whose
// bundle lives stays.
func TestCleanupRemovesOrphanAgentDirs(t *testing.T) {
	be := stateBackend(t)
	orphan := filepath.Join(be.stateDir, "agents", "0123456789abcdef")
	d, err := makeAgentDir(orphan, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.close()
	p := backendtest.TestPolicy()
	live, err := be.newBundle(&p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.remove("") })
	if live.agent, err = makeAgentDir(live.agentDir(), 1000, nil); err != nil {
		t.Fatal(err)
	}
	if err := be.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("the orphan agent directory is still there: %v", err)
	}
	if !live.agent.absent() {
		t.Error("absent() of an empty directory is false")
	}
	if _, err := os.Stat(live.agentDir()); err != nil {
		t.Errorf("a live sandbox's agent directory was removed: %v", err)
	}
	live.remove("")
	if m := airlocktest.MountsUnder(be.stateDir); len(m) > 0 {
		t.Errorf("mounts under the state directory left on the host: %v", m)
	}
}

// BenchmarkAgentDial: a new connection to a gVisor agent, carrying one
// request, through its directory (openat2, fstat, connect through
// /proc/self/fd, the peer's cgroup read) against a plain connect by path,
// the way before it, to the same agent. The daemon keeps idle
// connections, so a dial is paid only when a request finds none.
func BenchmarkAgentDial(b *testing.B) {
	be := testBackend(b)
	be.stateDir = b.TempDir()
	inst, err := be.Start(b.Context(), backendtest.TestPolicy(), nil)
	if err != nil {
		b.Fatal(err)
	}
	s := inst.(*agentSandbox)
	defer func() { s.Kill(b.Context()); s.Wait() }()
	c, err := s.Dial(b.Context()) // once it listens
	if err == nil {
		err = health(c)
	}
	if err != nil {
		b.Fatal(err)
	}
	dials := map[string]func() (net.Conn, error){
		"by-path":  func() (net.Conn, error) { return net.Dial("unix", filepath.Join(s.agent.path, agentSocket)) },
		"agentDir": func() (net.Conn, error) { return s.agent.dial(b.Context()) },
	}
	for _, name := range []string{"by-path", "agentDir"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				c, err := dials[name]()
				if err == nil {
					err = health(c)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
