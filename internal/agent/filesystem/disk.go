package filesystem

import (
	"encoding/json"
	"net/http"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// diskDirs are where the sandbox's writable file systems are: /tmp and
// the user's home, which may be one.
func (s *Service) diskDirs() []string { return []string{"/tmp", s.users.Home} }

// Disk answers the daemon's agentproto.DiskPath: what the sandbox's
// writable file systems hold.
func (s *Service) Disk(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(agentproto.Disk{Used: used(s.diskDirs())})
}

// used is what the file systems of dirs hold, in bytes, each counted
// once.
func used(dirs []string) int64 {
	var n int64
	seen := map[uint64]bool{}
	for _, dir := range dirs {
		var st unix.Stat_t
		var fs unix.Statfs_t
		if unix.Stat(dir, &st) != nil || seen[st.Dev] || unix.Statfs(dir, &fs) != nil {
			continue
		}
		seen[st.Dev] = true
		n += int64(fs.Blocks-fs.Bfree) * fs.Bsize
	}
	return n
}
