package filesystem

import (
	"encoding/json"
	"net/http"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestUsed: a file system is counted once, however many of the
// directories are on it, and a missing directory is none.
func TestUsed(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	one := used([]string{dir})
	if one <= 0 && fs.Blocks > fs.Bfree {
		t.Errorf("used %d of a file system with %d blocks in use", one, fs.Blocks-fs.Bfree)
	}
	if both := used([]string{dir, dir, dir + "/../" + "."}); both < one-one/10 || both > one+one/10 {
		t.Errorf("the same file system thrice: %d, want it once (%d)", both, one)
	}
	if got := used([]string{"/no/such/dir"}); got != 0 {
		t.Errorf("a missing directory: %d", got)
	}
}

func TestDisk(t *testing.T) {
	_, url, _ := newService(t)
	resp, err := http.Get(url + agentproto.DiskPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d agentproto.Disk
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || json.NewDecoder(resp.Body).Decode(&d) != nil || d.Used < 0 {
		t.Errorf("got %d %+v", resp.StatusCode, d)
	}
}
