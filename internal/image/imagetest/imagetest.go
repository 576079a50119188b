// Package imagetest builds small OCI images for tests, from the host's
// busybox-static: no registry outside the machine is ever needed.
package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Busybox is where Debian's busybox-static installs its binary.
const Busybox = "/bin/busybox"

// Applets are the commands the image has, as links to busybox.
var Applets = []string{"sh", "ls", "cat", "id", "echo", "touch", "rm", "mkdir", "stat", "df", "head", "sleep", "test", "grep", "wc", "dd", "chmod", "whoami", "nproc", "cp", "mv", "ln", "tr", "env", "true", "false", "mkfifo", "readlink"}

// Entry is one file of a layer.
type Entry struct {
	Name, Body, Link string
	Type             byte
	Mode             int64
	UID              int
}

// Layer makes a layer of entries.
func Layer(entries ...Entry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Link, Uid: e.UID, Gid: e.UID, Size: int64(len(e.Body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.Body)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// BusyboxImage is a root of busybox and its applets, an /etc with root
// and app (1500, home /home/app), /tmp, and layers on top of it; env and workdir in its configuration.
func BusyboxImage(env []string, workdir string, top ...v1.Layer) (v1.Image, error) {
	entries, err := busyboxEntries()
	if err != nil {
		return nil, err
	}
	base, err := Layer(entries...)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, append([]v1.Layer{base}, top...)...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf.Config.Env, cf.Config.WorkingDir = env, workdir
	cf.OS, cf.Architecture = "linux", "amd64"
	return mutate.ConfigFile(img, cf)
}

// busyboxEntries are the files of BusyboxImage's first layer.
func busyboxEntries() ([]Entry, error) {
	bin, err := os.ReadFile(Busybox)
	if err != nil {
		return nil, fmt.Errorf("%s (Debian's busybox-static): %w", Busybox, err)
	}
	entries := []Entry{
		{Name: "bin/", Type: tar.TypeDir}, {Name: "etc/", Type: tar.TypeDir}, {Name: "root/", Type: tar.TypeDir, Mode: 0o700},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777}, {Name: "srv/", Type: tar.TypeDir},
		{Name: "bin/busybox", Body: string(bin), Mode: 0o755},
		// The E2B SDK runs every command as bash -l -c: busybox's sh serves.
		{Name: "bin/bash", Body: "#!/bin/sh\nexec /bin/sh \"$@\"\n", Mode: 0o755},
		// A user of the image's own, as many images have (node, app…).
		{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1500:1500::/home/app:/bin/sh\n"},
		{Name: "etc/group", Body: "root:x:0:\napp:x:1500:\n"},
		{Name: "home/", Type: tar.TypeDir}, {Name: "home/app/", Type: tar.TypeDir, Mode: 0o755, UID: 1500},
	}
	for _, a := range Applets {
		entries = append(entries, Entry{Name: "bin/" + a, Type: tar.TypeSymlink, Link: "busybox"})
	}
	return entries, nil
}
