package daemon

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The daemon's limit on open files is raised to what the kernel allows,
// never lowered.
func TestRaiseFileLimit(t *testing.T) {
	var before unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &before); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &before) })
	got := raiseFileLimit()
	var after unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &after); err != nil {
		t.Fatal(err)
	}
	if got != after.Cur {
		t.Errorf("reported %d, the limit is %d", got, after.Cur)
	}
	if after.Cur < before.Cur || after.Max < before.Max {
		t.Fatalf("lowered: %+v, was %+v", after, before)
	}
	if !mayRaiseLimits() {
		return // a process without CAP_SYS_RESOURCE keeps its hard limit
	}
	want := uint64(maxFiles)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); n > 0 && n < want {
			want = n
		}
	}
	if after.Cur < want {
		t.Errorf("limit %d, want at least %d", after.Cur, want)
	}
}

// mayRaiseLimits reports whether this process has CAP_SYS_RESOURCE, which
// raising a hard limit takes (root in a container may lack it).
func mayRaiseLimits() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}
