package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/ocilayer"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A gVisor sandbox of a template has the image's layers as its root:
// stacked by the host's overlayfs read-only at the bundle's rootfs, which
// gVisor's gofer serves, under gVisor's own writable layer in the
// Sandbox's memory (runsc --overlay2=root:memory, of the disk limit).
// The host's overlay has no upper: nothing the sandbox does reaches the
// layers, and the sandbox's writes live and die in the Sentry.
//
// On top of the image's layers lies one of the bundle's own, made by the
// host: the mount points of what every sandbox gets (the generated /etc
// files, the agent) and the home and working directories, so that runsc
// never has to create a path in the image, whose symlinks it would
// follow on the host.

// imageRoot mounts the image root of p at the bundle's rootfs and returns
// the mounts for the generated /etc files.
func (b *bundle) imageRoot(p *policy.Policy, networked bool, trust []byte, extra []specs.Mount) ([]specs.Mount, error) {
	top := filepath.Join(b.dir, "top")
	rootfs := filepath.Join(b.dir, "rootfs")
	for _, d := range []string{rootfs, filepath.Join(top, "etc"), filepath.Join(top, "proc"), filepath.Join(top, "dev"),
		filepath.Join(top, "tmp"), filepath.Join(top, layout.Home[1:]), filepath.Join(top, p.Workdir[1:])} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(filepath.Join(top, "tmp"), 0o777|os.ModeSticky); err != nil {
		return nil, err
	}
	home := filepath.Join(top, layout.Home[1:])
	if err := os.Chmod(home, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chown(home, layout.UID, layout.GID); err != nil {
		return nil, err
	}
	for _, m := range extra {
		// A mount point of the source's kind: a file for a file.
		dst := filepath.Join(top, m.Destination)
		fi, err := os.Stat(m.Source)
		if err != nil {
			return nil, err
		}
		if fi.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
			err = os.WriteFile(dst, nil, 0o644)
		}
		if err != nil {
			return nil, err
		}
	}
	// The generated /etc files, over the image's.
	gen := filepath.Join(b.dir, "etc")
	if err := os.MkdirAll(gen, 0o755); err != nil {
		return nil, err
	}
	files := layout.GeneratedEtc(networked)
	var mounts []specs.Mount
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		if err := b.etcFile(gen, top, name, files[name], &mounts); err != nil {
			return nil, err
		}
	}
	lowers := append([]string{top}, p.RootLayers...)
	// The image's own passwd and group, read through the overlay of its
	// layers (never following its links out of it), with the sandbox's
	// user added where the image lacks one.
	if err := mountOverlay(rootfs, lowers[1:]); err != nil {
		return nil, err
	}
	passwd, perr := readImageFile(rootfs, "etc/passwd")
	group, gerr := readImageFile(rootfs, "etc/group")
	// The egress CA beside the image's roots. A store that is not a
	// file (or too large to read) is left as it is: the sandbox's
	// verifications of intercepted hosts fail, nothing else.
	var certs []byte
	var cerr error
	// An image without a store is left without one: the CA alone would be
	// all that REQUESTS_CA_BUNDLE's clients trust.
	if trust != nil {
		if certs, cerr = readImageFile(rootfs, layout.CABundle[1:]); cerr == nil && len(certs) > 0 && !bytes.Contains(certs, trust) {
			if certs[len(certs)-1] != '\n' {
				certs = append(certs, '\n')
			}
			certs = append(certs, trust...)
		}
	}
	// Detached, not unmounted: a copy of the host's mounts that another
	// sandbox's runsc made meanwhile (its own mount namespace) can keep
	// this one busy, and a plain unmount then fails with EBUSY now and
	// then (seen in CI). What holds it lets go of it by itself.
	if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil {
		return nil, fmt.Errorf("unmount the image's layers: %w", err)
	}
	if perr != nil || gerr != nil {
		return nil, errors.Join(perr, gerr)
	}
	passwd = appendMissing(passwd, layout.User+":", fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/sh\n", layout.User, layout.UID, layout.GID, layout.User, layout.Home))
	group = appendMissing(group, layout.User+":", fmt.Sprintf("%s:x:%d:\n", layout.User, layout.GID))
	if err := b.etcFile(gen, top, "passwd", passwd, &mounts); err != nil {
		return nil, err
	}
	if err := b.etcFile(gen, top, "group", group, &mounts); err != nil {
		return nil, err
	}
	if trust != nil && cerr == nil && len(certs) > 0 {
		if err := b.etcFile(gen, top, strings.TrimPrefix(layout.CABundle, "/etc/"), certs, &mounts); err != nil {
			return nil, err
		}
		b.trusted = true
	}
	if err := mountOverlay(rootfs, lowers); err != nil {
		return nil, err
	}
	return mounts, nil
}

// etcFile writes a generated /etc file, its mount point in top, and its
// read-only bind mount.
func (b *bundle) etcFile(gen, top, name string, data []byte, mounts *[]specs.Mount) error {
	for _, d := range []string{gen, filepath.Join(top, "etc")} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(d, name)), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(gen, name), data, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(top, "etc", name), nil, 0o644); err != nil {
		return err
	}
	*mounts = append(*mounts, specs.Mount{Destination: "/etc/" + name, Type: "bind", Source: filepath.Join(gen, name),
		Options: []string{"bind", "ro", "nosuid", "nodev"}})
	return nil
}

// mountOverlay mounts the directories lowers (top first) read-only at dir.
// overlayfs wants two lower layers at least when it has no upper one.
func mountOverlay(dir string, lowers []string) error {
	if len(lowers) == 1 {
		empty := filepath.Join(filepath.Dir(dir), "empty")
		if err := os.MkdirAll(empty, 0o755); err != nil {
			return err
		}
		lowers = append(lowers, empty)
	}
	for _, l := range lowers {
		if strings.ContainsAny(l, ":,\\") {
			return fmt.Errorf("layer path %q cannot be given to overlayfs", l)
		}
	}
	data := "lowerdir=" + strings.Join(lowers, ":")
	if len(data) >= os.Getpagesize() {
		return fmt.Errorf("the image has too many layers for gVisor's root (%d)", len(lowers))
	}
	if err := unix.Mount("airlock", dir, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount the image's layers (overlayfs): %w", err)
	}
	return nil
}

// unmountRoot detaches the bundle's image root, if it has one.
func (b *bundle) unmountRoot() error {
	err := unix.Unmount(filepath.Join(b.dir, "rootfs"), unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount the image root: %w", err)
	}
	return nil
}

// readImageFile reads rel of an image's root, which may be absent (empty)
// but may not be anything but a small regular file: the image is
// untrusted, and its links resolve inside the root only.
func readImageFile(root, rel string) ([]byte, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.OpenFile(rel, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the image's /%s: %v", rel, errors.Unwrap(err))
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("the image's /%s is not a file", rel)
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
	if err != nil || len(data) > 1<<20 {
		return nil, fmt.Errorf("the image's /%s is unreadable or larger than 1 MiB", rel)
	}
	return data, nil
}

// appendMissing adds line to data unless a line starts with prefix.
func appendMissing(data []byte, prefix, line string) []byte {
	for _, l := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(l, []byte(prefix)) {
			return data
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	return append(data, line...)
}

// exportSkip are the paths a build's layer leaves out: mount points, and
// /tmp, the sandbox's scratch space (its own tmpfs here).
var exportSkip = []string{"dev", "proc", "tmp", layout.CodeDir[1:], layout.SudoPath[1:]}

// ExportRoot writes what the sandbox changed of its image's root, gVisor's
// writable layer, as an OCI layer: runsc serializes it (whiteouts as 0:0
// devices, opaque directories as an xattr), which becomes OCI's form here.
//
// runsc writes it into a pipe, never a host file: it writes every file at
// its full size, sparse or not, so a layer of a few sparse files would
// fill the host's disk before anything read it (1 GiB came of a 64 MiB
// layer). What reads w stops at its budget, and runsc then fails on the
// closed pipe. The pipe is runsc's fd 3: its stdout carries more than the
// archive.
func (s *agentSandbox) ExportRoot(ctx context.Context, w io.Writer) error {
	if !s.b.image {
		return errors.New("the sandbox's root is not an image's")
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.CommandContext(ctx, s.runsc, append(s.b.runscArgs(), "tar", "rootfs-upper", "--file", "/proc/self/fd/3", s.b.id)...)
	cmd.ExtraFiles = []*os.File{pw}
	cmd.Env = runscEnv
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return fmt.Errorf("runsc tar rootfs-upper: %w", err)
	}
	convErr := ocilayer.FromOverlayTar(w, r, exportSkip)
	if convErr == nil {
		// The archive's padding, to the end of what runsc writes.
		if n, _ := io.Copy(io.Discard, io.LimitReader(r, 1<<20)); n == 1<<20 {
			convErr = errors.New("the sandbox's layer: more data after the archive's end")
		}
	}
	if convErr != nil {
		// Read no further: runsc's writes fail, and it ends.
		r.Close()
		cmd.Process.Kill()
	}
	if err := cmd.Wait(); err != nil && convErr == nil {
		// A runsc that failed part way may have written an archive's
		// worth of nothing: what was read counts for nothing.
		return fmt.Errorf("runsc tar rootfs-upper: %v: %s", err, firstLine(out.Bytes()))
	}
	return convErr
}
