package filesystem

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// File metadata as envd (0.6.2) keeps it: a user's key/value pairs in the
// file's user.e2b.* extended attributes. An upload sets them from its
// X-Metadata-<key> headers, replacing the file's whole set (O_TRUNC keeps a
// file's xattrs, so keys the upload does not name are removed); every
// EntryInfo reports them, including ones sandbox code set with setfattr.
const (
	metadataHeader = "X-Metadata-"
	metadataXattr  = "user.e2b."
	// The kernel caps an xattr's name at 255 bytes, prefix included.
	maxMetadataKey = 255 - len(metadataXattr)
	// envd's budget for one file's set (names with the prefix, and
	// values): what fits in an ext4 inode's xattr block.
	maxMetadataSize = 4096
)

// UploadMetadata reads an upload's metadata from its headers: the prefix
// stripped, the key lowercased, a repeated header's first value. A request
// without any gives nil (which clears the file's set).
func UploadMetadata(h http.Header) (map[string]string, *agentproto.Error) {
	var md map[string]string
	size := 0
	for name, values := range h {
		if len(values) == 0 || len(name) <= len(metadataHeader) || !strings.EqualFold(name[:len(metadataHeader)], metadataHeader) {
			continue
		}
		key, value := strings.ToLower(name[len(metadataHeader):]), values[0]
		if len(key) > maxMetadataKey {
			return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "metadata key %q is longer than %d bytes", key, maxMetadataKey)
		}
		if !printable(key) || !printable(value) {
			return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "metadata %q: keys and values must be printable US-ASCII", key)
		}
		if size += len(metadataXattr) + len(key) + len(value); size > maxMetadataSize {
			return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "metadata is larger than %d bytes", maxMetadataSize)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = value
	}
	return md, nil
}

func printable(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// SetMetadata replaces f's metadata with md, through the open file (not its
// path, which sandbox code could swap meanwhile). A file system without
// user xattrs keeps none, as in envd: the answer, read back from the file,
// then shows none either.
func SetMetadata(f *os.File, md map[string]string) error {
	names, err := xattrNames(func(buf []byte) (int, error) { return unix.Flistxattr(int(f.Fd()), buf) })
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, name := range names {
		key, ours := strings.CutPrefix(name, metadataXattr)
		if _, keep := md[key]; ours && !keep {
			if err := unix.Fremovexattr(int(f.Fd()), name); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(int(f.Fd()), metadataXattr+k, []byte(v), 0); errors.Is(err, unix.ENOTSUP) {
			return nil
		} else if err != nil {
			return err
		}
	}
	return nil
}

// Metadata is path's metadata (following a symlink, as envd does; the
// kernel allows no user xattrs on links themselves), nil when it has none
// or cannot be read. Values that are not UTF-8 (setfattr allows any bytes)
// are left out: proto3 JSON strings must be.
func Metadata(path string) map[string]string {
	names, err := xattrNames(func(buf []byte) (int, error) { return unix.Listxattr(path, buf) })
	if err != nil {
		return nil
	}
	var md map[string]string
	buf := make([]byte, 4096)
	for _, name := range names {
		key, ours := strings.CutPrefix(name, metadataXattr)
		if !ours {
			continue
		}
		n, err := unix.Getxattr(path, name, buf)
		if err != nil || !utf8.ValidString(key) || !utf8.Valid(buf[:n]) {
			continue // removed meanwhile, or larger than any upload makes
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(buf[:n])
	}
	return md
}

// xattrNames lists a file's xattr names with list, sizing the buffer as
// the kernel asks (the list can grow between the two calls).
func xattrNames(list func([]byte) (int, error)) ([]string, error) {
	for {
		n, err := list(nil)
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = list(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}
