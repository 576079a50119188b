package clusterbin

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
	"testing/fstest"

	"golang.org/x/sys/unix"
)

// testBinary is a cluster binary made of data, as make would embed it.
func testBinary(data []byte) *binary {
	files := fstest.MapFS{}
	if data != nil {
		files[binPath] = &fstest.MapFile{Data: data, Mode: 0o755}
	}
	return &binary{src: files}
}

// echo is a program that prints its arguments: /bin/echo's bytes.
func echo(t *testing.T) []byte {
	t.Helper()
	path, err := exec.LookPath("echo")
	if err != nil {
		t.Skip("no echo(1) here")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestWithoutBinary(t *testing.T) {
	for _, data := range [][]byte{nil, {}} {
		b := testBinary(data)
		if _, err := b.command("router"); err == nil || err.Error() != "this airlock was built without its cluster binary: build it with make build" {
			t.Errorf("a build without the binary (%q): %v", data, err)
		}
	}
}

// TestCommandRuns: the binary runs from its memory file, named as the
// cluster binary, with the arguments given.
func TestCommandRuns(t *testing.T) {
	b := testBinary(echo(t))
	cmd, err := b.command("router", "--listen", ":80")
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Args[0] != "airlock-cluster" {
		t.Errorf("argv[0] = %q", cmd.Args[0])
	}
	out, err := cmd.Output()
	if err != nil || string(out) != "router --listen :80\n" {
		t.Errorf("the command printed %q (%v)", out, err)
	}
	// Loaded once: a second command runs the same file.
	again, _ := b.command()
	if again.Path != cmd.Path {
		t.Errorf("a second command runs %s, the first %s", again.Path, cmd.Path)
	}
}

// TestSealed: nothing can change the loaded binary: it cannot be
// written, grown, shrunk, nor its seals removed.
func TestSealed(t *testing.T) {
	data := echo(t)
	b := testBinary(data)
	f, err := b.load()
	if err != nil {
		t.Fatal(err)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if err != nil || seals&want != want {
		t.Errorf("seals %#x (%v), want %#x", seals, err, want)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Error("the sealed file was written")
	}
	if err := f.Truncate(1); err == nil {
		t.Error("the sealed file was shrunk")
	}
	// Through another descriptor of it, too.
	w, err := os.OpenFile(path(f), os.O_WRONLY, 0)
	if err == nil {
		_, err = w.Write([]byte("x"))
		w.Close()
	}
	if err == nil {
		t.Error("the sealed file was written through /proc")
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the file holds other bytes than the binary's (%v)", err)
	}
}
