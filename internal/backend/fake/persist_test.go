package fake

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// call sends a request to inst's agent, as the daemon does, and returns
// the status and body.
func call(t *testing.T, inst backend.Instance, method, path string, body io.Reader) (int, []byte, http.Header) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return inst.Dial(ctx) }}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), method, "http://agent"+path, body)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data, resp.Trailer
}

// setupEnv gives inst's agent env, as the daemon's setup does.
func setupEnv(t *testing.T, inst backend.Instance, env map[string]string) {
	t.Helper()
	body, _ := json.Marshal(agentproto.Setup{EnvVars: env})
	if code, msg, _ := call(t, inst, http.MethodPost, agentproto.SetupPath+"setup", strings.NewReader(string(body))); code != http.StatusNoContent {
		t.Fatalf("setup: %d %s", code, msg)
	}
}

// quiesce asks inst's agent to let go of its socket, as the daemon does
// before a checkpoint or a snapshot.
func quiesce(t *testing.T, inst backend.Instance) {
	t.Helper()
	if code, msg, _ := call(t, inst, http.MethodPost, agentproto.SetupPath+"checkpoint", nil); code != http.StatusNoContent {
		t.Fatalf("checkpoint: %d %s", code, msg)
	}
}

func serves(t *testing.T, inst backend.Instance) bool {
	t.Helper()
	code, err := health(t.Context(), inst.(*Instance))
	return err == nil && code == http.StatusNoContent
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func cleanup(t *testing.T, inst backend.Instance) {
	t.Cleanup(func() {
		inst.Kill(context.Background())
		inst.Wait()
	})
}

// A checkpoint ends the instance and keeps its box by a name; a restore
// serves the same agent (its environment kept) over the same files,
// under the policy it is given, and forgets the name.
func TestCheckpointAndRestore(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	setupEnv(t, inst, map[string]string{"A": "1"})
	writeFile(t, filepath.Join(inst.Home(), "work", "notes"), "kept")
	quiesce(t, inst)
	name, err := inst.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	<-inst.Done()
	if _, err := inst.Dial(t.Context()); !errors.Is(err, ErrEnded) {
		t.Errorf("Dial of a checkpointed instance: %v, want ErrEnded", err)
	}
	inst.Wait() // a checkpointed instance's Wait keeps its box
	if saved, _ := b.Saved(); !slices.Equal(saved, []string{name}) {
		t.Fatalf("Saved() = %v, want [%s]", saved, name)
	}
	p := policy.Default()
	p.MemoryBytes = 128 << 20
	r, err := b.Restore(t.Context(), name, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, r)
	ri := r.(*Instance)
	if !serves(t, ri) {
		t.Fatal("the restored instance does not serve")
	}
	if got := readFile(t, filepath.Join(ri.Home(), "work", "notes")); got != "kept" {
		t.Errorf("restored file holds %q", got)
	}
	if got := ri.Env(); !maps.Equal(got, map[string]string{"A": "1"}) {
		t.Errorf("restored environment %v", got)
	}
	if ri.Policy().MemoryBytes != 128<<20 {
		t.Errorf("restored under memory %d, want the policy given", ri.Policy().MemoryBytes)
	}
	if saved, _ := b.Saved(); len(saved) != 0 {
		t.Errorf("Saved() = %v after the restore, want none", saved)
	}
	if _, err := b.Restore(t.Context(), name, p, nil); err == nil {
		t.Error("a second restore of one checkpoint succeeded")
	}
	if got := len(b.Instances()); got != 2 {
		t.Errorf("%d instances, want 2: the started one and the restored one", got)
	}
}

// A real runtime cannot save a socket bound on the host: a checkpoint of
// an agent that was not asked to let go of it fails, and one that fails
// for any reason leaves the instance serving.
func TestCheckpointFailuresKeepItServing(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	if _, err := inst.Checkpoint(t.Context()); err == nil || !strings.Contains(err.Error(), "not asked") {
		t.Fatalf("checkpoint without the agent's release: %v", err)
	}
	if !serves(t, inst) {
		t.Fatal("not serving after a refused checkpoint")
	}
	boom := errors.New("boom")
	b.SetError(OpCheckpoint, boom)
	quiesce(t, inst)
	if _, err := inst.Checkpoint(t.Context()); !errors.Is(err, boom) {
		t.Fatalf("checkpoint with an injected failure: %v", err)
	}
	if !serves(t, inst) {
		t.Fatal("not serving again after a failed checkpoint")
	}
	if saved, _ := b.Saved(); len(saved) != 0 {
		t.Errorf("Saved() = %v after failed checkpoints", saved)
	}
	// It can be quiesced again, and then saved.
	b.SetError(OpCheckpoint, nil)
	quiesce(t, inst)
	if _, err := inst.Checkpoint(t.Context()); err != nil {
		t.Fatalf("checkpoint after failed ones: %v", err)
	}
}

func TestRestoreFailureKeepsTheSave(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	quiesce(t, inst)
	name, err := inst.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	b.SetError(OpRestore, boom)
	if _, err := b.Restore(t.Context(), name, policy.Default(), nil); !errors.Is(err, boom) {
		t.Fatalf("restore with an injected failure: %v", err)
	}
	if saved, _ := b.Saved(); !slices.Equal(saved, []string{name}) {
		t.Fatalf("Saved() = %v after a failed restore, want it kept", saved)
	}
	b.SetError(OpRestore, nil)
	r, err := b.Restore(t.Context(), name, policy.Default(), nil)
	if err != nil {
		t.Fatalf("a second try: %v", err)
	}
	cleanup(t, r)
	if _, err := b.Restore(t.Context(), "nope", policy.Default(), nil); err == nil {
		t.Error("restore of an unknown name succeeded")
	}
}

func TestForget(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	quiesce(t, inst)
	name, err := inst.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Forget(name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(inst.Home()); !os.IsNotExist(err) {
		t.Errorf("the forgotten box's files: %v, want gone", err)
	}
	if saved, _ := b.Saved(); len(saved) != 0 {
		t.Errorf("Saved() = %v after Forget", saved)
	}
	if err := b.Forget("nope"); err != nil {
		t.Errorf("Forget of an unknown name: %v", err)
	}
	if _, err := b.Restore(t.Context(), name, policy.Default(), nil); err == nil {
		t.Error("restore of a forgotten box succeeded")
	}
}

// A snapshot copies the files and the environment while the instance
// runs on; each clone starts over a copy of its own.
func TestSnapshotAndClone(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	setupEnv(t, inst, map[string]string{"A": "1"})
	writeFile(t, filepath.Join(inst.Home(), "f"), "original")
	writeFile(t, filepath.Join(inst.tmp, "t"), "in tmp")
	if err := os.Symlink("f", filepath.Join(inst.Home(), "link")); err != nil {
		t.Fatal(err)
	}
	quiesce(t, inst)
	dir := filepath.Join(t.TempDir(), "snap")
	if err := inst.Snapshot(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	if !serves(t, inst) {
		t.Fatal("the snapshotted instance does not serve again")
	}
	var clones []*Instance
	for range 2 {
		c, err := b.Clone(t.Context(), dir, policy.Default(), nil)
		if err != nil {
			t.Fatal(err)
		}
		cleanup(t, c)
		clones = append(clones, c.(*Instance))
	}
	writeFile(t, filepath.Join(clones[0].Home(), "f"), "changed in a clone")
	for i, c := range clones {
		if !serves(t, c) {
			t.Fatalf("clone %d does not serve", i)
		}
		if got := c.Env(); !maps.Equal(got, map[string]string{"A": "1"}) {
			t.Errorf("clone %d's environment %v", i, got)
		}
		if got := readFile(t, filepath.Join(c.tmp, "t")); got != "in tmp" {
			t.Errorf("clone %d's /tmp file holds %q", i, got)
		}
		if l, err := os.Readlink(filepath.Join(c.Home(), "link")); err != nil || l != "f" {
			t.Errorf("clone %d's link: %q %v", i, l, err)
		}
	}
	if got := readFile(t, filepath.Join(clones[1].Home(), "f")); got != "original" {
		t.Errorf("a clone sees another's change: %q", got)
	}
	if got := readFile(t, filepath.Join(inst.Home(), "f")); got != "original" {
		t.Errorf("the original sees a clone's change: %q", got)
	}
	if b.Clones() != 2 {
		t.Errorf("Clones() = %d, want 2", b.Clones())
	}
}

func TestSnapshotFailuresKeepItServing(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	dir := filepath.Join(t.TempDir(), "snap")
	if err := inst.Snapshot(t.Context(), dir); err == nil {
		t.Fatal("a snapshot without the agent's release succeeded")
	}
	boom := errors.New("boom")
	b.SetError(OpSnapshot, boom)
	quiesce(t, inst)
	if err := inst.Snapshot(t.Context(), dir); !errors.Is(err, boom) {
		t.Fatalf("snapshot with an injected failure: %v", err)
	}
	if !serves(t, inst) {
		t.Fatal("not serving after a failed snapshot")
	}
	b.SetError(OpSnapshot, nil)
	quiesce(t, inst)
	if err := inst.Snapshot(t.Context(), t.TempDir()); err == nil {
		t.Error("a snapshot into a directory that exists succeeded")
	}
	if !serves(t, inst) {
		t.Fatal("not serving after a refused snapshot")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a failed snapshot left its directory: %v", err)
	}
}

func TestCloneRefusesWhatIsNoSnapshot(t *testing.T) {
	b := New(t.TempDir(), nil)
	var se *backend.StateError
	if _, err := b.Clone(t.Context(), t.TempDir(), policy.Default(), nil); !errors.As(err, &se) {
		t.Errorf("clone of an empty directory: %v, want a StateError", err)
	}
	corrupt := t.TempDir()
	writeFile(t, filepath.Join(corrupt, snapshotMarker), "{")
	if _, err := b.Clone(t.Context(), corrupt, policy.Default(), nil); !errors.As(err, &se) || !strings.Contains(se.Error(), "corrupt") {
		t.Errorf("clone of a corrupt snapshot: %v", err)
	}
	inst := start(t, b)
	quiesce(t, inst)
	dir := filepath.Join(t.TempDir(), "snap")
	if err := inst.Snapshot(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	b.SetError(OpClone, boom)
	if _, err := b.Clone(t.Context(), dir, policy.Default(), nil); !errors.Is(err, boom) {
		t.Errorf("clone with an injected failure: %v", err)
	}
	if got := b.Live(); got != 1 {
		t.Errorf("%d live instances, want only the original", got)
	}
}

// A sandbox with a network is saved and copied as gVisor's is: each
// restore and each copy runs in the namespace it is given then, and one
// given a namespace its policy has no network for is refused.
func TestNetworkedInstanceIsPersisted(t *testing.T) {
	b := New(t.TempDir(), nil)
	nsFile := func() *os.File {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	p := policy.Default()
	p.Network = policy.Network{Mode: policy.NetFiltered}
	first := nsFile()
	i, err := b.Start(t.Context(), p, first)
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, i)
	quiesce(t, i)
	dir := filepath.Join(t.TempDir(), "s")
	if err := i.(*Instance).Snapshot(t.Context(), dir); err != nil {
		t.Fatalf("snapshot with a network: %v", err)
	}
	copyNS := nsFile()
	c, err := b.Clone(t.Context(), dir, p, copyNS)
	if err != nil {
		t.Fatalf("clone with a network: %v", err)
	}
	cleanup(t, c)
	if c.(*Instance).NetNS() != copyNS {
		t.Error("the copy does not run in the namespace it was given")
	}
	if _, err := b.Clone(t.Context(), dir, p, nil); err == nil {
		t.Error("a copy whose policy has a network started without a namespace")
	}
	quiesce(t, i)
	name, err := i.(*Instance).Checkpoint(t.Context())
	if err != nil {
		t.Fatalf("checkpoint with a network: %v", err)
	}
	if _, err := b.Restore(t.Context(), name, policy.Default(), nsFile()); err == nil {
		t.Error("a restore given a namespace its policy has no network for")
	}
	again := nsFile()
	r, err := b.Restore(t.Context(), name, p, again)
	if err != nil {
		t.Fatalf("restore with a network: %v", err)
	}
	cleanup(t, r)
	if r.(*Instance).NetNS() != again || !serves(t, r) {
		t.Error("the restored instance is not in its new namespace, serving")
	}
}

func TestSocketPathTooLong(t *testing.T) {
	b := New(filepath.Join(t.TempDir(), strings.Repeat("d", 100)), nil)
	if _, err := b.Start(t.Context(), policy.Default(), nil); err == nil || !strings.Contains(err.Error(), "shorter") {
		t.Errorf("a socket path over the limit: %v", err)
	}
}
