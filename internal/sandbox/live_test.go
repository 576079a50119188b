package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
)

// With live restore, sandboxes running or paused in memory outlive their
// manager: the next one takes them back, the same sandboxes (ids,
// tokens, metadata, time to live running on, state) in the same boxes,
// never stopped. A pool's box is not kept; a record whose box ended
// meanwhile is dropped; a box no record names is removed; a kill removes
// the record.
func TestLiveSandboxesOutliveTheManager(t *testing.T) {
	b := fake.New(t.TempDir(), testLog(t))
	b.KeepAlive()
	clock := newFakeClock()
	cfg := restartable(t.TempDir(), b, nil)
	cfg.LiveRestore, cfg.PauseInMemory, cfg.Clock = true, true, clock
	m1 := managerOn(t, cfg, 1, b)
	waitFor(t, m1, "the pool is full", func() bool { return pooled(m1) == 1 })
	running := create(t, m1, CreateRequest{Metadata: map[string]string{"kind": "running"}})
	paused := create(t, m1, CreateRequest{Metadata: map[string]string{"kind": "paused"}})
	died := create(t, m1, CreateRequest{})
	if err := m1.Pause(t.Context(), paused.ID, true); err != nil {
		t.Fatal(err)
	}
	writeHome(t, instance(running), "f", "kept")
	boxes := map[string]*fake.Instance{running.ID: instance(running), paused.ID: instance(paused)}
	diedBox := instance(died)
	m1.Shutdown()
	for id, box := range boxes {
		if box.Killed() || box.Waited() {
			t.Errorf("Shutdown ended sandbox %s's box", id)
		}
	}
	// While no manager runs: time passes, one box dies, and one that no
	// record names (a create cut short) is left.
	clock.Advance(20 * time.Second)
	diedBox.Kill(t.Context())
	diedBox.Wait()
	stray, err := b.Start(t.Context(), running.pol, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Reattach()

	cfg.LiveRestore = false // this one's Shutdown ends them all
	m2 := managerOn(t, cfg, 0, b)
	for _, old := range []*Sandbox{running, paused} {
		sb, err := m2.Get(old.ID)
		if err != nil {
			t.Fatalf("sandbox %s was not taken back: %v", old.ID, err)
		}
		if sb.AccessToken != old.AccessToken || sb.TrafficToken != old.TrafficToken || sb.Metadata["kind"] != old.Metadata["kind"] || !sb.StartedAt.Equal(old.StartedAt) {
			t.Errorf("sandbox %s came back as %+v", old.ID, sb)
		}
		if instance(sb) != boxes[old.ID] {
			t.Errorf("sandbox %s came back in another box", old.ID)
		}
	}
	sb, _ := m2.Get(running.ID)
	if got, want := sb.EndAt(), running.EndAt(); !got.Equal(want) || sb.State() != Running {
		t.Errorf("running sandbox: ends at %v, %s; want %v, running", got, sb.State(), want)
	}
	if got := readHome(t, instance(sb), "f"); got != "kept" {
		t.Errorf("its file: %q", got)
	}
	if p, _ := m2.Get(paused.ID); p.State() != Paused || !boxes[paused.ID].Paused() {
		t.Errorf("paused sandbox came back %s", p.State())
	}
	if err := m2.Resume(t.Context(), paused.ID, 0); err != nil || boxes[paused.ID].Paused() {
		t.Errorf("resume of the paused sandbox: %v", err)
	}
	if _, err := m2.Get(died.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("a sandbox whose box died while no manager ran: %v", err)
	}
	if _, err := os.Stat(filepath.Join(m2.liveDir(), died.ID+".json")); !os.IsNotExist(err) {
		t.Errorf("its record: %v, want none", err)
	}
	if !stray.(*fake.Instance).Waited() {
		t.Error("a kept box no record names was not removed")
	}
	// The time to live ran on while no manager ran: 40 s of the minute
	// are left.
	clock.Advance(41 * time.Second)
	waitFor(t, m2, "the running sandbox expired", gone(m2, running.ID))
	if _, err := os.Stat(filepath.Join(m2.liveDir(), running.ID+".json")); !os.IsNotExist(err) {
		t.Errorf("an ended sandbox's record: %v, want none", err)
	}
}
