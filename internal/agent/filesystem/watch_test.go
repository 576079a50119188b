package filesystem

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestEventTypeOf(t *testing.T) {
	for mask, want := range map[uint32]eventType{
		unix.IN_CREATE: eventCreate, unix.IN_MOVED_TO: eventCreate, unix.IN_CREATE | unix.IN_ISDIR: eventCreate,
		unix.IN_MODIFY: eventWrite, unix.IN_DELETE: eventRemove, unix.IN_DELETE_SELF: eventRemove,
		unix.IN_MOVED_FROM: eventRename, unix.IN_MOVE_SELF: eventRename, unix.IN_ATTRIB: eventChmod,
		unix.IN_CLOSE_WRITE: "", unix.IN_IGNORED: "",
	} {
		got, ok := eventTypeOf(mask)
		if got != want || ok != (want != "") {
			t.Errorf("mask %#x: %q %v, want %q", mask, got, ok, want)
		}
	}
}

func TestNetworkFS(t *testing.T) {
	for typ, want := range map[int64]bool{
		unix.NFS_SUPER_MAGIC: true, unix.CIFS_SUPER_MAGIC: true, unix.SMB2_SUPER_MAGIC: true, unix.FUSE_SUPER_MAGIC: true,
		unix.TMPFS_MAGIC: false, unix.EXT4_SUPER_MAGIC: false, unix.OVERLAYFS_SUPER_MAGIC: false,
	} {
		if got := networkFS(typ); got != want {
			t.Errorf("type %#x: network %v, want %v", typ, got, want)
		}
	}
}

func TestTrimNUL(t *testing.T) {
	for in, want := range map[string]string{"name\x00\x00\x00": "name", "name": "name", "\x00": "", "": ""} {
		if got := string(trimNUL([]byte(in))); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}
