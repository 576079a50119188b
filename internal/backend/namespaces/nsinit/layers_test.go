package nsinit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// socketPair is the layers' socket, as the host makes it.
func socketPair(t *testing.T) (host, init int) {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(pair[0]); unix.Close(pair[1]) })
	return pair[0], pair[1]
}

// openDirs opens n directories, each with a file naming it.
func openDirs(t *testing.T, n int) []int {
	t.Helper()
	var fds []int
	for i := range n {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "name"), []byte{byte('a' + i)}, 0o644)
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		fds = append(fds, fd)
	}
	return fds
}

// The layers arrive in one message, in the order sent: the top first.
func TestReceiveLayers(t *testing.T) {
	host, init := socketPair(t)
	sent := openDirs(t, 3)
	if err := unix.Sendmsg(host, []byte{3}, unix.UnixRights(sent...), nil, 0); err != nil {
		t.Fatal(err)
	}
	got, err := receiveLayers(init, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, fd := range got {
		data := make([]byte, 1)
		f, err := unix.Openat(fd, "name", unix.O_RDONLY, 0)
		if err == nil {
			unix.Read(f, data)
			unix.Close(f)
		}
		if data[0] != byte('a'+i) {
			t.Errorf("layer %d is %q", i, data)
		}
		unix.Close(fd)
	}
}

// Fewer or more layers than the config says is an error, and what came
// is closed.
func TestReceiveLayersCountMismatch(t *testing.T) {
	host, init := socketPair(t)
	if err := unix.Sendmsg(host, []byte{2}, unix.UnixRights(openDirs(t, 2)...), nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := receiveLayers(init, 3); err == nil || !strings.Contains(err.Error(), "got 2 of 3") {
		t.Errorf("2 of 3 layers: %v", err)
	}
	// A message without descriptors, and a socket closed by the host.
	unix.Sendmsg(host, []byte{0}, nil, nil, 0)
	if _, err := receiveLayers(init, 1); err == nil {
		t.Error("received layers from a message without any")
	}
	unix.Shutdown(host, unix.SHUT_WR)
	if _, err := receiveLayers(init, 1); err == nil {
		t.Error("received layers from a closed socket")
	}
}

// sendUpper hands the host the writable layer's directory itself.
func TestSendUpper(t *testing.T) {
	host, init := socketPair(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "changed"), []byte("x"), 0o644)
	if err := sendUpper(init, dir); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(host, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("%v %v", fds, err)
	}
	defer unix.Close(fds[0])
	var st unix.Stat_t
	if err := unix.Fstatat(fds[0], "changed", &st, 0); err != nil {
		t.Errorf("the received directory is not the layer: %v", err)
	}
	if err := sendUpper(init, filepath.Join(dir, "missing")); err == nil {
		t.Error("sent a missing directory")
	}
}
