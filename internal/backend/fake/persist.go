package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A checkpoint (backend.Checkpointer) ends the instance but keeps its box
// (the agent in memory, its directory) in the backend under a name, which
// Restore serves again as a new instance and then forgets, as gVisor
// removes a checkpoint once its sandbox runs again. A backend made anew
// (a test's next daemon with another fake) has no such name: what a
// restart keeps on disk is the manager's records, not the fake's boxes.
//
// A snapshot (backend.Snapshotter) copies the box's files, and the
// environment the daemon set up, into a directory while it runs on;
// Clone starts a new agent over a copy of them with that environment.
// What else a real copy of memory would carry (processes, kernels) is not
// copied: the agent runs in the test's process.

// snapshotMarker names the file that makes a directory a fake snapshot.
const snapshotMarker = "fake-snapshot.json"

// Checkpoint saves the instance, whose agent must have let go of its
// socket, and ends it; on error it runs on, its agent listening again.
func (i *Instance) Checkpoint(ctx context.Context) (string, error) {
	if err := i.awaitRelease(ctx); err != nil {
		i.listenAgain()
		return "", err
	}
	if err := i.b.failure(OpCheckpoint); err != nil {
		i.listenAgain()
		return "", err
	}
	i.mu.Lock()
	i.saved = true
	i.mu.Unlock()
	i.stop()
	<-i.done
	i.b.mu.Lock()
	defer i.b.mu.Unlock()
	i.b.checkpoints++
	name := fmt.Sprintf("%016x", i.b.checkpoints)
	i.b.saved[name] = i.box
	return name, nil
}

// Restore serves the box saved as name again, under p; it is forgotten
// once it serves. A failed restore leaves it saved.
func (b *Backend) Restore(ctx context.Context, name string, p policy.Policy, netns *os.File) (backend.Instance, error) {
	if err := backend.CheckNetNS(&p, netns); err != nil {
		return nil, err
	}
	if err := b.failure(OpRestore); err != nil {
		return nil, err
	}
	b.mu.Lock()
	bx := b.saved[name]
	b.mu.Unlock()
	if bx == nil {
		return nil, fmt.Errorf("no saved sandbox %q", name)
	}
	i, err := b.serve(bx, p, netns)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	delete(b.saved, name)
	b.mu.Unlock()
	return i, nil
}

// Forget removes the saved box name; an unknown name is no error.
func (b *Backend) Forget(name string) error {
	b.mu.Lock()
	bx := b.saved[name]
	delete(b.saved, name)
	b.mu.Unlock()
	if bx != nil {
		return os.RemoveAll(bx.dir)
	}
	return nil
}

// Saved lists the names of the saved boxes, sorted.
func (b *Backend) Saved() ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.saved))
	for n := range b.saved {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// fakeSnapshot is what a snapshot keeps of the box's memory.
type fakeSnapshot struct {
	Env map[string]string
}

// Snapshot copies the instance's files and environment into dir, which
// must not exist; its agent must have let go of its socket, and listens
// again however it ends.
func (i *Instance) Snapshot(ctx context.Context, dir string) error {
	defer i.listenAgain()
	if err := i.awaitRelease(ctx); err != nil {
		return err
	}
	if err := i.b.failure(OpSnapshot); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	err := copyTree(i.home, filepath.Join(dir, "home"))
	if err == nil {
		err = copyTree(i.tmp, filepath.Join(dir, "tmp"))
	}
	if err == nil {
		data, _ := json.Marshal(fakeSnapshot{Env: i.Env()})
		err = os.WriteFile(filepath.Join(dir, snapshotMarker), data, 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
	}
	return err
}

// Clone starts a new instance under p over a copy of the snapshot in
// dir, with its environment; dir is only read.
func (b *Backend) Clone(ctx context.Context, dir string, p policy.Policy, netns *os.File) (backend.Instance, error) {
	if err := backend.CheckNetNS(&p, netns); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.clones++
	b.mu.Unlock()
	data, err := os.ReadFile(filepath.Join(dir, snapshotMarker))
	if err != nil {
		return nil, &backend.StateError{Reason: "is not a snapshot of the fake backend's"}
	}
	var snap fakeSnapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return nil, &backend.StateError{Reason: "is corrupt"}
	}
	if err := b.failure(OpClone); err != nil {
		return nil, err
	}
	bx, err := b.newBox()
	if err != nil {
		return nil, err
	}
	err = copyTree(filepath.Join(dir, "home"), bx.home)
	if err == nil {
		err = copyTree(filepath.Join(dir, "tmp"), bx.tmp)
	}
	if err == nil && len(snap.Env) > 0 {
		err = bx.setEnv(snap.Env)
	}
	if err != nil {
		os.RemoveAll(bx.dir)
		return nil, err
	}
	return b.serve(bx, p, netns)
}

// setEnv sets env up in bx's agent, as the daemon's setup did in the
// box it is a copy of.
func (bx *box) setEnv(env map[string]string) error {
	body, _ := json.Marshal(agentproto.Setup{EnvVars: env})
	req := httptest.NewRequest(http.MethodPost, agentproto.SetupPath+"setup", strings.NewReader(string(body)))
	rec := httptest.NewRecorder()
	bx.agentHandler.ServeHTTP(rec, req)
	if rec.Code != http.StatusNoContent {
		return errors.New("the agent refused the environment: " + rec.Result().Status)
	}
	bx.envMu.Lock()
	defer bx.envMu.Unlock()
	maps.Copy(bx.env, env)
	return nil
}
