package agentproto

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Commands are found with the sandbox's PATH: regular, executable files
// only, the first directory first.
func TestLookPath(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(dir1, "tool"), []byte("#!/bin/sh\n"), 0o644) // not executable
	os.WriteFile(filepath.Join(dir2, "tool"), []byte("#!/bin/sh\n"), 0o755)
	os.Mkdir(filepath.Join(dir1, "dir"), 0o755)
	os.WriteFile(filepath.Join(dir2, "first"), nil, 0o755)
	os.WriteFile(filepath.Join(dir1, "first"), nil, 0o755)
	env := []string{"HOME=/x", "PATH=" + dir1 + ":" + dir2}
	for name, want := range map[string]string{
		"tool":           filepath.Join(dir2, "tool"),
		"first":          filepath.Join(dir1, "first"),
		"/abs/not/there": "/abs/not/there", // a path is the command's to fail on
		"./rel":          "./rel",
	} {
		if got, err := LookPath(name, env); err != nil || got != want {
			t.Errorf("LookPath(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"dir", "missing"} {
		if _, err := LookPath(name, env); err == nil || !strings.Contains(err.Error(), "not found in the sandbox") {
			t.Errorf("LookPath(%q): %v", name, err)
		}
	}
	if _, err := LookPath("tool", []string{"HOME=/x"}); err == nil {
		t.Error("found a command without a PATH")
	}
}

// Frames round-trip; a frame over the limit, or cut short, is an error,
// and a stream that ends between frames is io.EOF.
func TestFrames(t *testing.T) {
	var b bytes.Buffer
	big := bytes.Repeat([]byte("x"), 5000) // written in two writes
	for _, p := range [][]byte{nil, []byte("hello"), big} {
		if err := WriteFrame(&b, FrameStdout, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range [][]byte{nil, []byte("hello"), big} {
		typ, got, err := ReadFrame(&b, MaxFrame)
		if err != nil || typ != FrameStdout || !bytes.Equal(got, want) {
			t.Fatalf("ReadFrame = %q, %d bytes, %v", typ, len(got), err)
		}
	}
	if _, _, err := ReadFrame(&b, MaxFrame); err != io.EOF {
		t.Errorf("at the end: %v, want io.EOF", err)
	}
	WriteFrame(&b, FrameStdin, big)
	if _, _, err := ReadFrame(&b, 100); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("over the limit: %v", err)
	}
	b.Reset()
	WriteFrame(&b, FrameStdin, []byte("cut short"))
	if _, _, err := ReadFrame(bytes.NewReader(b.Bytes()[:b.Len()-2]), MaxFrame); err != io.ErrUnexpectedEOF {
		t.Errorf("cut short: %v, want io.ErrUnexpectedEOF", err)
	}
}

// CopyStdin frames what it reads and ends with FrameStdinEnd.
func TestCopyStdin(t *testing.T) {
	var b bytes.Buffer
	if err := CopyStdin(&b, strings.NewReader("abc")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		typ, p, err := ReadFrame(&b, MaxFrame)
		if err != nil {
			break
		}
		got = append(got, string(typ)+string(p))
	}
	if strings.Join(got, ",") != "Iabc,Z" {
		t.Errorf("frames %q", got)
	}
}
