package build

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Files keeps the uploads of COPY steps (tar archives of the files, as
// E2B's SDK sends them, gzipped or not) by the hash the SDK gives them.
type Files struct {
	dir   string
	limit int64
}

// OpenFiles returns the upload store in dir, making it if needed. An
// upload may be at most limit bytes.
func OpenFiles(dir string, limit int64) (*Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("build uploads: %w", err)
	}
	return &Files{dir: dir, limit: limit}, nil
}

func (f *Files) path(hash string) string { return filepath.Join(f.dir, hash+".tar") }

// Has reports whether the upload of hash is here.
func (f *Files) Has(hash string) bool {
	if !validHash(hash) {
		return false
	}
	_, err := os.Stat(f.path(hash))
	return err == nil
}

// ErrTooLarge: an upload past the limit.
var ErrTooLarge = errors.New("the upload is too large")

// Put stores r as the upload of hash; a partial upload leaves nothing.
func (f *Files) Put(hash string, r io.Reader) error {
	if !validHash(hash) {
		return fmt.Errorf("files hash %q is not a sha256", hash)
	}
	tmp, err := os.CreateTemp(f.dir, ".upload-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(r, f.limit+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n > f.limit {
		return fmt.Errorf("%w: at most %d bytes", ErrTooLarge, f.limit)
	}
	// The first upload of a hash stays: a replayed URL must not swap
	// the files of a build that used them.
	if err := os.Link(tmp.Name(), f.path(hash)); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// open returns the upload of hash as an uncompressed tar stream.
func (f *Files) open(hash string) (io.ReadCloser, error) {
	file, err := os.Open(f.path(hash))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the files of this COPY (%s) were not uploaded", hash)
	}
	if err != nil {
		return nil, internal("the files of this COPY could not be read", err)
	}
	br := bufio.NewReader(file)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			file.Close()
			return nil, fmt.Errorf("the upload is not a valid gzip stream: %v", err)
		}
		return struct {
			io.Reader
			io.Closer
		}{zr, file}, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{br, file}, nil
}

// copy is a COPY step: the entries of the upload that src names, laid
// out under dest as Docker's COPY does (a directory's contents go into
// dest; a file goes to dest, or into it when dest ends in "/"), owned by
// the step's user, with its mode if it gives one.
func (st *state) copy(ctx context.Context, s *Step) error {
	src := path.Clean(strings.TrimPrefix(s.Args[0], "./"))
	dest := st.abs(s.Args[1])
	intoDir := strings.HasSuffix(s.Args[1], "/")
	user, mode := "", int64(-1)
	if len(s.Args) > 2 {
		user = s.Args[2]
	}
	if len(s.Args) > 3 && s.Args[3] != "" {
		m, _ := strconv.ParseInt(s.Args[3], 8, 64)
		mode = m
	}
	upload, err := st.files.open(s.FilesHash)
	if err != nil {
		return err
	}
	defer upload.Close()
	glob := strings.ContainsAny(src, "*?[")
	pr, pw := io.Pipe()
	go func() {
		tr, tw := tar.NewReader(upload), tar.NewWriter(pw)
		found := false
		err := func() error {
			for {
				hdr, err := tr.Next()
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return fmt.Errorf("the upload is not a valid tar archive: %v", err)
				}
				name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
				rel, ok := copyTarget(name, src, glob, hdr.Typeflag == tar.TypeDir, intoDir)
				if !ok {
					continue
				}
				found = true
				// Names from the root: the agent lays them out in "/".
				hdr.Name = strings.TrimPrefix(path.Join(dest, rel), "/")
				if hdr.Name == "" {
					hdr.Name = "."
				}
				if mode >= 0 && hdr.Typeflag != tar.TypeSymlink {
					hdr.Mode = mode
				}
				if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeDir && hdr.Typeflag != tar.TypeSymlink {
					continue
				}
				if err := tw.WriteHeader(hdr); err != nil {
					return err
				}
				if _, err := io.Copy(tw, tr); err != nil {
					return err
				}
			}
		}()
		if err == nil && !found {
			err = fmt.Errorf("the upload has nothing at %s", src)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	err = st.untar(ctx, "/", user, pr, false)
	pr.CloseWithError(errors.New("copy ended"))
	return err
}

// copyTarget is where the upload's entry name goes, relative to the
// directory the step lays files out in (see copy), and whether it is
// copied at all.
func copyTarget(name, src string, glob, isDir, intoDir bool) (string, bool) {
	if glob {
		top, rest, _ := strings.Cut(name, "/")
		// The pattern names entries of the top of the context, or of the
		// directory it is in.
		dir, pattern := path.Split(src)
		dir = strings.TrimSuffix(dir, "/")
		if dir != "" {
			sub, ok := strings.CutPrefix(name, dir+"/")
			if !ok {
				return "", false
			}
			top, rest, _ = strings.Cut(sub, "/")
		}
		if ok, _ := path.Match(pattern, top); !ok {
			return "", false
		}
		if rest == "" {
			return top, true
		}
		return top + "/" + rest, true
	}
	switch {
	case name == src && isDir:
		return ".", true
	case name == src && intoDir:
		return path.Base(src), true
	case name == src:
		return ".", true // the file is dest
	}
	if rel, ok := strings.CutPrefix(name, src+"/"); ok {
		return rel, true
	}
	return "", false
}

// PutContext stores, as an upload, src of the build context directory
// ctxDir (a file, a directory with everything below it, or a pattern of
// names in one directory), in the layout E2B's SDK uploads: paths
// relative to the context. Symlinks are stored as symlinks, never
// followed. It returns the upload's hash, that of its content.
func (f *Files) PutContext(ctxDir, src string) (string, error) {
	root, err := os.OpenRoot(ctxDir)
	if err != nil {
		return "", fmt.Errorf("build context: %w", err)
	}
	defer root.Close()
	src = path.Clean(strings.TrimPrefix(src, "./"))
	if src == ".." || strings.HasPrefix(src, "../") || path.IsAbs(src) {
		return "", fmt.Errorf("COPY %s: the source must be inside the build context", src)
	}
	names, err := fs.Glob(root.FS(), src)
	if err != nil || len(names) == 0 {
		return "", fmt.Errorf("COPY %s: nothing of that name in the build context", src)
	}
	tmp, err := os.CreateTemp(f.dir, ".context-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(tmp, h))
	var size int64
	for _, n := range names {
		err := fs.WalkDir(root.FS(), n, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				if link, err = root.Readlink(p); err != nil {
					return err
				}
			} else if !fi.Mode().IsRegular() && !fi.IsDir() {
				return nil // sockets, devices: nothing to copy
			}
			hdr, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = p, 0, 0, "", ""
			if fi.IsDir() {
				hdr.Name += "/"
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				return nil
			}
			if size += fi.Size(); size > f.limit {
				return fmt.Errorf("%w: at most %d bytes", ErrTooLarge, f.limit)
			}
			file, err := openListed(root, p, fi)
			if err != nil {
				return err
			}
			defer file.Close()
			_, err = io.CopyN(tw, file, fi.Size())
			return err
		})
		if err != nil {
			tmp.Close()
			return "", fmt.Errorf("COPY %s: %w", src, err)
		}
	}
	if err := tw.Close(); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	hash := hex.EncodeToString(h.Sum(nil))
	if err := os.Link(tmp.Name(), f.path(hash)); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	return hash, nil
}

// openListed opens p of root, which a walk listed as the regular file fi,
// without blocking (a FIFO put in its place since would hang the build)
// and checks that it still is that file: a build context may be a
// directory that a sandbox wrote.
func openListed(root *os.Root, p string, fi fs.FileInfo) (*os.File, error) {
	file, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if now, err := file.Stat(); err != nil || !os.SameFile(fi, now) || !now.Mode().IsRegular() {
		file.Close()
		return nil, fmt.Errorf("%s changed while it was read", p)
	}
	return file, nil
}
