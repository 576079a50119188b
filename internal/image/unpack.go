package image

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/ocilayer"
)

// Limits bound what one image may unpack to.
type Limits struct {
	LayerBytes int64 // file contents of one layer
	ImageBytes int64 // of all its layers
	Entries    int   // of one layer
	Layers     int
}

// DefaultLimits are generous for real images and stop archive bombs.
var DefaultLimits = Limits{LayerBytes: 8 << 30, ImageBytes: 16 << 30, Entries: 1 << 20, Layers: 127}

// maxID is the highest uid or gid an entry may have: a sandbox maps 65,536
// ids, and a file of any other id would be owned by no one inside.
const maxID = 65535

// UnpackError is an archive or layer refused for what it holds; Error
// names the entry and why, for the user.
type UnpackError struct{ Msg string }

func (e *UnpackError) Error() string { return e.Msg }

func refuse(format string, args ...any) error { return &UnpackError{fmt.Sprintf(format, args...)} }

// unpack writes the layer tar r into the empty directory dst as overlayfs
// expects a lower layer: OCI whiteouts (".wh.NAME") become whiteouts of
// overlayfs (0:0 character devices), opaque markers (".wh..wh..opq") the
// opaque xattrs on their directory. Every path is created through an
// os.Root, so no entry, symlink or hardlink can reach outside dst; entries
// that try (absolute or ".." names, hardlinks out of the layer), device
// nodes and ids a sandbox cannot map are refused, as is a layer past lim.
// It returns the bytes of file contents written and the sha256 of the
// uncompressed stream (its diff ID).
func unpack(r io.Reader, dst string, lim Limits, budget int64) (size int64, diffID string, err error) {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return 0, "", err
	}
	defer root.Close()
	// Every byte read goes through h, the padding after the archive's
	// end included: the diff ID is of the whole stream.
	h := sha256.New()
	stream := io.TeeReader(r, h)
	u := &unpacker{root: root, tr: tar.NewReader(stream), lim: lim, budget: budget}
	for n := 0; ; n++ {
		hdr, err := u.tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return u.size, "", refuse("the layer is cut short: its tar archive ends inside an entry")
		}
		if err != nil {
			return u.size, "", refuse("the layer is not a valid tar archive: %v", err)
		}
		if n >= lim.Entries {
			return u.size, "", refuse("the layer has more than %d entries", lim.Entries)
		}
		if err := u.entry(hdr); err != nil {
			return u.size, "", err
		}
	}
	// archive/tar stops at the end-of-archive blocks; GNU tar and Python's
	// tarfile pad on to a 10,240-byte record. The digest is of all of it,
	// so the rest is read through h too, and counts against the layer's
	// limit as file contents do: a stream that ends in a flood of padding
	// costs the host no more than a file of that size would.
	left := min(lim.LayerBytes, budget) - u.size
	n, err := io.CopyN(io.Discard, stream, left+1)
	if err != nil && !errors.Is(err, io.EOF) {
		return u.size, "", err
	}
	if n > left {
		return u.size, "", refuse("the layer unpacks to more than its limit (%d bytes for one layer, %d for the image)", lim.LayerBytes, budget)
	}
	// Directories last: writing their entries changed their times.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		root.Chtimes(u.dirs[i].name, u.dirs[i].mtime, u.dirs[i].mtime)
	}
	return u.size, "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// unpacker is one layer being unpacked through an os.Root.
type unpacker struct {
	root   *os.Root
	tr     *tar.Reader
	lim    Limits
	budget int64
	size   int64 // bytes of regular files written so far
	dirs   []dirTime
}

type dirTime struct {
	name  string
	mtime time.Time
}

// entry unpacks one entry of the layer: checked, its parent made, a
// whiteout applied or the entry made, then its owner, mode and time.
func (u *unpacker) entry(hdr *tar.Header) error {
	root := u.root
	name, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Uid > maxID || hdr.Gid < 0 || hdr.Gid > maxID {
		return refuse("entry %q is owned by %d:%d: a sandbox maps ids 0 to %d only", hdr.Name, hdr.Uid, hdr.Gid, maxID)
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if name != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return refuse("entry %q: %v", hdr.Name, err)
		}
	}
	switch {
	case base == ".wh..wh..opq":
		if err := opaque(root, dir); err != nil {
			return refuse("entry %q: %v", hdr.Name, err)
		}
		return nil
	case strings.HasPrefix(base, ".wh."):
		if err := whiteout(root, dir, base[len(".wh."):]); err != nil {
			return refuse("entry %q: %v", hdr.Name, err)
		}
		return nil
	}
	if name != "." && hdr.Typeflag != tar.TypeDir {
		// A later entry replaces an earlier one of the same path.
		if err := root.RemoveAll(name); err != nil {
			return refuse("entry %q: %v", hdr.Name, err)
		}
	}
	made, err := u.make(hdr, name, dir, base)
	if err != nil || !made {
		return err
	}
	if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	if hdr.Typeflag != tar.TypeSymlink && hdr.Typeflag != tar.TypeLink {
		if err := root.Chmod(name, fileMode(hdr.Mode)); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag != tar.TypeDir {
			root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
	}
	return nil
}

// make makes the entry name of hdr's type; made is false for entries
// that are metadata of the archive, not files.
func (u *unpacker) make(hdr *tar.Header, name, dir, base string) (made bool, err error) {
	root := u.root
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return false, refuse("entry %q: %v", hdr.Name, err)
		}
		if fi, err := root.Lstat(name); err != nil || !fi.IsDir() {
			return false, refuse("entry %q: not a directory where one was made", hdr.Name)
		}
		u.dirs = append(u.dirs, dirTime{name, hdr.ModTime})
	case tar.TypeReg:
		if hdr.Size > u.lim.LayerBytes-u.size || hdr.Size > u.budget-u.size {
			return false, refuse("the layer unpacks to more than its limit (%d bytes for one layer, %d for the image)", u.lim.LayerBytes, u.budget)
		}
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return false, refuse("entry %q: %v", hdr.Name, err)
		}
		written, err := io.Copy(f, io.LimitReader(u.tr, hdr.Size))
		u.size += written
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return false, refuse("the layer is cut short: it ends inside entry %q", hdr.Name)
		}
		if err != nil {
			return false, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	case tar.TypeSymlink:
		// The target is resolved inside the sandbox, never here.
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return false, refuse("entry %q: %v", hdr.Name, err)
		}
	case tar.TypeLink:
		target, err := entryName(hdr.Linkname)
		if err != nil {
			return false, err
		}
		fi, err := root.Lstat(target)
		if err != nil || !fi.Mode().IsRegular() {
			return false, refuse("entry %q links to %q, which is not a file of the layer", hdr.Name, hdr.Linkname)
		}
		if err := root.Link(target, name); err != nil {
			return false, refuse("entry %q: %v", hdr.Name, err)
		}
	case tar.TypeFifo:
		if err := mknod(root, dir, base, unix.S_IFIFO|uint32(hdr.Mode&0o777), 0); err != nil {
			return false, refuse("entry %q: %v", hdr.Name, err)
		}
	case tar.TypeChar, tar.TypeBlock:
		return false, refuse("entry %q is a device node: images may not carry any", hdr.Name)
	default:
		return false, nil // PAX and GNU metadata, read by archive/tar itself
	}
	return true, nil
}

// fileMode converts a tar entry's Unix mode bits to an os.FileMode,
// whose setuid, setgid and sticky bits are not the Unix ones.
func fileMode(m int64) os.FileMode {
	fm := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// entryName cleans a tar entry's name to a path relative to the layer's
// root, refusing any that would leave it.
func entryName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", refuse("entry %q has a NUL byte in its name", name)
	}
	trimmed := strings.TrimPrefix(name, "./")
	if path.IsAbs(trimmed) {
		return "", refuse("entry %q has an absolute name", name)
	}
	for _, part := range strings.Split(trimmed, "/") {
		if part == ".." {
			return "", refuse("entry %q leaves the layer (..)", name)
		}
	}
	clean := path.Clean(trimmed)
	if clean == "" {
		clean = "."
	}
	// Every entry is made by a walk from the layer's root (os.Root): its
	// cost grows with its depth, which is bounded as a build's export is.
	if strings.Count(clean, "/") > ocilayer.MaxDepth || len(clean) > 4096 {
		return "", refuse("entry %q is deeper than %d directories or longer than 4096 bytes", name[:min(len(name), 64)]+"…", ocilayer.MaxDepth)
	}
	return clean, nil
}

// whiteout marks name in dir as deleted, for the layers below.
func whiteout(root *os.Root, dir, name string) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return errors.New("a whiteout of no name")
	}
	if err := root.RemoveAll(path.Join(dir, name)); err != nil {
		return err
	}
	return mknod(root, dir, name, unix.S_IFCHR, 0)
}

// opaque marks dir as hiding what the layers below hold in it, with the
// xattr overlayfs reads as host root (trusted.) and inside a user
// namespace (user.).
func opaque(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if err := unix.Fsetxattr(int(d.Fd()), attr, []byte("y"), 0); err != nil {
			return fmt.Errorf("opaque directory: %w", err)
		}
	}
	return nil
}

// mknod makes a node name in dir, through the directory's descriptor (an
// os.Root has no Mknod).
func mknod(root *os.Root, dir, name string, mode uint32, dev int) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Mknodat(int(d.Fd()), name, mode, dev)
}
