// Package ocilayer writes what a sandbox changed of its image root as an
// OCI image layer.
package ocilayer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// WriteUpperLayer writes the overlayfs upper directory dir (a sandbox's
// writable layer, mounted with userxattr) to w as an OCI layer: whiteouts
// (0:0 character devices) become ".wh.NAME" entries, opaque directories
// (user.overlay.opaque) a ".wh..wh..opq" entry. Owners are the sandbox's
// own ids: the files' host ids less idBase.
//
// The directory is the sandbox's, so nothing of it is trusted: every name
// is opened relative to its parent's descriptor with O_NOFOLLOW, so no
// symlink is ever followed, and what is read is checked to be what was
// listed (a regular file, opened without blocking). What is not a file,
// directory, symlink, FIFO or whiteout (sockets, device nodes) is left
// out. The paths in skip (mount points such as "dev" and "proc", relative
// to the layer's root) are left out too, with all below them. The layer is then unpacked like any other
// (image.Store.AddLayer), with all its checks.
//
// The walk ends with ctx, and at more than maxEntries entries or MaxDepth
// levels of directories: what the sandbox made must not cost the host
// more than the layer's own limits allow.
func WriteUpperLayer(ctx context.Context, w io.Writer, dir *os.File, idBase, maxEntries int, skip []string) error {
	tw := tar.NewWriter(w)
	e := &exporter{ctx: ctx, tw: tw, idBase: idBase, left: maxEntries, links: map[[2]uint64]string{}, skip: skip}
	fd, err := unix.Dup(int(dir.Fd()))
	if err != nil {
		return err
	}
	if err := e.dir(fd, "", 0); err != nil {
		return err
	}
	return tw.Close()
}

// MaxDepth bounds how deep a layer's directories go: the cost of
// unpacking an entry grows with its depth.
const MaxDepth = 128

type exporter struct {
	ctx    context.Context
	tw     *tar.Writer
	idBase int
	left   int                  // entries the layer may still have
	links  map[[2]uint64]string // device and inode → first name, for hardlinks
	skip   []string
}

// dir writes the entries of the directory fd (closed here), which is rel
// in the layer ("" for its root) at depth, a batch of names at a time.
func (e *exporter) dir(fd int, rel string, depth int) error {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if depth > MaxDepth {
		return fmt.Errorf("%s is more than %d directories deep", rel, MaxDepth)
	}
	for {
		names, err := f.Readdirnames(1024)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s/: %w", rel, err)
		}
		for _, name := range names {
			if slices.Contains(e.skip, path.Join(rel, name)) {
				continue
			}
			if e.left--; e.left < 0 {
				return errors.New("the layer has too many entries")
			}
			if err := e.ctx.Err(); err != nil {
				return err
			}
			if err := e.entry(fd, rel, name, depth); err != nil {
				return err
			}
		}
	}
}

func (e *exporter) entry(parent int, rel, name string, depth int) error {
	p := path.Join(rel, name)
	var st unix.Stat_t
	if err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	hdr, err := e.header(p, &st)
	if err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s/: %w", p, err)
		}
		hdr.Typeflag, hdr.Name = tar.TypeDir, p+"/"
		if err := e.tw.WriteHeader(hdr); err != nil {
			unix.Close(fd)
			return err
		}
		if opaqueDir(fd) {
			wh := *hdr
			wh.Typeflag, wh.Name, wh.Mode = tar.TypeReg, p+"/.wh..wh..opq", 0
			if err := e.tw.WriteHeader(&wh); err != nil {
				unix.Close(fd)
				return err
			}
		}
		return e.dir(fd, p, depth+1)
	case unix.S_IFREG:
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := e.links[key]; ok && st.Nlink > 1 {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return e.tw.WriteHeader(hdr)
		}
		e.links[key] = p
		return e.file(parent, name, hdr, &st)
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(parent, name, buf)
		if err != nil {
			return fmt.Errorf("readlink %s: %w", p, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
		return e.tw.WriteHeader(hdr)
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return e.tw.WriteHeader(hdr)
	case unix.S_IFCHR:
		if st.Rdev == 0 { // overlayfs' whiteout: the name was removed
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeReg, path.Join(rel, ".wh."+name), 0
			return e.tw.WriteHeader(hdr)
		}
	}
	return nil // sockets and device nodes have no place in a layer
}

// header describes the entry of st, owned by its ids in the sandbox.
func (e *exporter) header(p string, st *unix.Stat_t) (*tar.Header, error) {
	uid, gid := int(st.Uid)-e.idBase, int(st.Gid)-e.idBase
	if uid < 0 || uid > MaxID || gid < 0 || gid > MaxID {
		return nil, fmt.Errorf("%s is owned by host ids %d:%d, outside the sandbox's", p, st.Uid, st.Gid)
	}
	return &tar.Header{
		Name:    p,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     uid,
		Gid:     gid,
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
		Format:  tar.FormatPAX,
	}, nil
}

// file writes the regular file name, checked once open to be the file
// that was listed: it may not have been swapped for a FIFO or a device.
func (e *exporter) file(parent int, name string, hdr *tar.Header, listed *unix.Stat_t) error {
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), hdr.Name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Ino != listed.Ino || st.Dev != listed.Dev {
		return fmt.Errorf("%s changed while it was read", hdr.Name)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if err := e.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(e.tw, f, st.Size); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s changed while it was read", hdr.Name)
		}
		return fmt.Errorf("read %s: %w", hdr.Name, err)
	}
	return nil
}

// opaqueDir reports whether overlayfs marked the directory fd opaque:
// everything of it in the lower layers is hidden.
func opaqueDir(fd int) bool {
	buf := make([]byte, 4)
	for _, attr := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		if n, err := unix.Fgetxattr(fd, attr, buf); err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// MaxID is the highest id a sandbox maps: it has 65,536 of its own.
const MaxID = 65535

// FromOverlayTar rewrites r, a tar of an overlay's upper layer in the
// overlay's own terms (runsc tar rootfs-upper: whiteouts as 0:0
// character devices, opaque directories with the xattr
// trusted.overlay.opaque=y), as an OCI layer to w. The paths in skip
// are left out with all below them, and so are device nodes and other
// xattrs.
func FromOverlayTar(w io.Writer, r io.Reader, skip []string) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	// Whiteouts may share one inode, and so come as hard links to the
	// first: a link to a whiteout is a whiteout.
	whiteouts := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return fmt.Errorf("the sandbox's layer: %w", err)
		}
		name := path.Clean("/" + hdr.Name)[1:]
		if name == "" {
			continue // the root itself
		}
		if slices.ContainsFunc(skip, func(s string) bool { return name == s || strings.HasPrefix(name, s+"/") }) {
			continue
		}
		if hdr.Uid < 0 || hdr.Uid > MaxID || hdr.Gid < 0 || hdr.Gid > MaxID {
			return fmt.Errorf("%s is owned by %d:%d, outside the sandbox's ids", name, hdr.Uid, hdr.Gid)
		}
		opaque := hdr.PAXRecords["SCHILY.xattr.trusted.overlay.opaque"] == "y"
		out := &tar.Header{Name: name, Mode: hdr.Mode & 0o7777, Uid: hdr.Uid, Gid: hdr.Gid, ModTime: hdr.ModTime, Format: tar.FormatPAX}
		switch hdr.Typeflag {
		case tar.TypeDir:
			out.Typeflag, out.Name = tar.TypeDir, name+"/"
		case tar.TypeReg:
			out.Typeflag, out.Size = tar.TypeReg, hdr.Size
		case tar.TypeSymlink:
			out.Typeflag, out.Linkname = tar.TypeSymlink, hdr.Linkname
		case tar.TypeLink:
			target := path.Clean("/" + hdr.Linkname)[1:]
			if whiteouts[target] {
				dir, base := path.Split(name)
				out.Typeflag, out.Name, out.Mode = tar.TypeReg, dir+".wh."+base, 0
				whiteouts[name] = true
				break
			}
			out.Typeflag, out.Linkname = tar.TypeLink, target
		case tar.TypeFifo:
			out.Typeflag = tar.TypeFifo
		case tar.TypeChar:
			if hdr.Devmajor != 0 || hdr.Devminor != 0 {
				continue // a device node has no place in a layer
			}
			dir, base := path.Split(name)
			out.Typeflag, out.Name, out.Mode = tar.TypeReg, dir+".wh."+base, 0
			whiteouts[name] = true
		default:
			continue
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		if out.Typeflag == tar.TypeReg && out.Size > 0 {
			if _, err := io.CopyN(tw, tr, out.Size); err != nil {
				return fmt.Errorf("the sandbox's layer: %s: %w", name, err)
			}
		}
		if opaque && hdr.Typeflag == tar.TypeDir {
			wh := &tar.Header{Name: name + "/.wh..wh..opq", Typeflag: tar.TypeReg, ModTime: hdr.ModTime, Format: tar.FormatPAX}
			if err := tw.WriteHeader(wh); err != nil {
				return err
			}
		}
	}
}
