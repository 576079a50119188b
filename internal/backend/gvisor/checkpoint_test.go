package gvisor

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// TestSavesAndRestores: a sandbox saved whole (Checkpoint) and restored,
// one that a snapshot saved as it runs on, and a clone of that snapshot
// all serve again, their agents listening by themselves (no resume
// signal: its grace outlasts the test), each back on its own CPU quota
// once it does.
func TestSavesAndRestores(t *testing.T) {
	be := testBackend(t)
	defer func(g time.Duration) { resumeGrace = g }(resumeGrace)
	resumeGrace = time.Hour
	p := policy.Default()
	p.CPUs = 0.5

	orig := startSaving(t, be, p)
	if err := write(t, orig, "/tmp/mark", "before"); err != nil {
		t.Fatal(err)
	}

	snap := filepath.Join(t.TempDir(), "snap")
	quiesce(t, orig)
	if err := orig.Snapshot(t.Context(), snap); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if got := read(t, orig, "/tmp/mark"); got != "before" {
		t.Errorf("the snapshotted sandbox reads %q", got)
	}

	clone, err := be.Clone(t.Context(), snap, p, nil)
	if err != nil {
		t.Fatalf("Clone: %v", err)
	}
	stopAtEnd(t, clone)
	if got := read(t, clone, "/tmp/mark"); got != "before" {
		t.Errorf("the clone reads %q", got)
	}
	awaitQuota(t, clone.(*agentSandbox), p.CPUs)

	quiesce(t, orig)
	name, err := orig.Checkpoint(t.Context())
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	orig.Wait()
	restored, err := be.Restore(t.Context(), name, p, nil)
	if err != nil {
		be.Forget(name)
		t.Fatalf("Restore: %v", err)
	}
	stopAtEnd(t, restored)
	if got := read(t, restored, "/tmp/mark"); got != "before" {
		t.Errorf("the restored sandbox reads %q", got)
	}
	awaitQuota(t, restored.(*agentSandbox), p.CPUs)
	restored.(backend.Committer).Commit()
}

// TestManySnapshots: a sandbox serves on after many snapshots. Each
// leaves the socket its agent let go of held by gVisor's gofer, whose
// inode counts in the agent's directory (agentDirOptions): with 8
// inodes, the agent could not listen again after the sixth.
func TestManySnapshots(t *testing.T) {
	be := testBackend(t)
	inst := startSaving(t, be, policy.Default())
	for i := range 12 {
		quiesce(t, inst)
		dir := filepath.Join(t.TempDir(), "snap")
		if err := inst.Snapshot(t.Context(), dir); err != nil {
			t.Fatalf("snapshot %d: %v", i+1, err)
		}
		os.RemoveAll(dir)
		if got := read(t, inst, "/etc/hostname"); got == "" {
			t.Fatalf("after snapshot %d: the agent reads nothing", i+1)
		}
	}
}

// saver is what the test needs of a gVisor sandbox.
type saver interface {
	backend.Instance
	backend.Checkpointer
	backend.Snapshotter
}

func startSaving(t *testing.T, be *Backend, p policy.Policy) saver {
	t.Helper()
	inst, err := be.Start(t.Context(), p, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	stopAtEnd(t, inst)
	return inst.(saver)
}

func stopAtEnd(t *testing.T, inst backend.Instance) {
	t.Cleanup(func() {
		inst.Kill(context.Background())
		inst.Wait()
	})
}

func agentClient(t *testing.T, inst backend.Instance) *agentproto.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return inst.Dial(ctx) }}
	t.Cleanup(tr.CloseIdleConnections)
	return &agentproto.Client{Transport: tr}
}

// quiesce has the agent let go of its socket, as the manager does
// before every save.
func quiesce(t *testing.T, inst backend.Instance) {
	t.Helper()
	if err := agentClient(t, inst).Checkpoint(t.Context()); err != nil {
		t.Fatalf("the agent's checkpoint: %v", err)
	}
}

func write(t *testing.T, inst backend.Instance, path, data string) error {
	resp, err := agentClient(t, inst).Do(t.Context(), agentproto.EnvdPort, http.MethodPost, agentproto.FilesPath+"?path="+path, "application/octet-stream", strings.NewReader(data))
	if err == nil {
		resp.Body.Close()
	}
	return err
}

func read(t *testing.T, inst backend.Instance, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	resp, err := agentClient(t, inst).Do(ctx, agentproto.EnvdPort, http.MethodGet, agentproto.FilesPath+"?path="+path, "", nil)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// awaitQuota waits until s's cgroup has its own CPU quota of cpus again
// (a restore runs with more until its agent listens).
func awaitQuota(t *testing.T, s *agentSandbox, cpus float64) {
	t.Helper()
	want := strconv.FormatInt(int64(cpus*100_000), 10)
	var got string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = cpuQuota(t, s.b.id); got == want {
			return
		}
	}
	t.Errorf("CPU quota %s µs after the restore, want %s", got, want)
}

// cpuQuota reads sandbox id's CPU quota in µs per 100 ms period.
func cpuQuota(t *testing.T, id string) string {
	t.Helper()
	name := cgroups.Prefix + id
	if b, err := os.ReadFile(filepath.Join(cgroups.Root, name, "cpu.max")); err == nil {
		return strings.Fields(string(b))[0]
	}
	b, err := os.ReadFile(filepath.Join(cgroups.Root, "cpu", name, "cpu.cfs_quota_us"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
