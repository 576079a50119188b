package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// warmTemplate is a template whose sandboxes are clones of a save of its
// first ready one; readied counts its Ready calls.
func warmTemplate(readied *atomic.Int32, poolSize int) Template {
	return Template{Name: "ci", Policy: policy.Default(), PoolSize: poolSize, WarmSnapshot: true,
		Ready: func(context.Context, *agentproto.Client) error { readied.Add(1); return nil }}
}

func pooledOf(m *Manager, name string) int {
	_, p := m.Counts()
	return p[name]
}

// One sandbox of the template is started and readied, saved, and
// removed; its pool, its cold creates and the resumes of its sandboxes
// that kept their files are clones of that save, readied once for all.
func TestWarmSnapshotClones(t *testing.T) {
	var readied atomic.Int32
	m, b := persistent(t, Config{Templates: []Template{warmTemplate(&readied, 2)}})
	waitFor(t, m, "the pool holds two clones", func() bool { return pooledOf(m, "ci") == 2 })
	if b.Starts() != 1 || b.Clones() != 2 || readied.Load() != 1 {
		t.Errorf("%d starts, %d clones, %d readied; want 1, 2, 1", b.Starts(), b.Clones(), readied.Load())
	}
	if m.metrics.warmMade.Load() != 1 || m.metrics.clones.Load() != 2 {
		t.Errorf("metrics: %d made, %d clones", m.metrics.warmMade.Load(), m.metrics.clones.Load())
	}
	first := b.Instances()[0]
	removed(t, first) // the saved one is not kept running
	sb := create(t, m, CreateRequest{TemplateID: "ci"})
	// A cold create, the pool emptied, is a clone too.
	m.SetPoolSize("ci", 0)
	waitFor(t, m, "the pool empties", func() bool { return pooledOf(m, "ci") == 0 })
	clones := b.Clones()
	create(t, m, CreateRequest{TemplateID: "ci"})
	if b.Clones() != clones+1 || b.Starts() != 1 {
		t.Errorf("a cold create: %d clones, %d starts; want a clone", b.Clones()-clones, b.Starts())
	}
	// A resume of a sandbox that kept its files is one.
	writeHome(t, instance(sb), "f", "kept")
	if err := m.Pause(t.Context(), sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if b.Clones() != clones+2 || b.Starts() != 1 {
		t.Errorf("a resume of files: %d clones, %d starts; want a clone", b.Clones()-clones, b.Starts())
	}
	if got := readHome(t, instance(sb), "f"); got != "kept" {
		t.Errorf("the file holds %q", got)
	}
	// A sandbox with limits of its own is started as asked, not cloned.
	custom := create(t, m, CreateRequest{TemplateID: "ci", Limits: Limits{MemoryBytes: 128 << 20}})
	if b.Starts() != 2 || instance(custom).Policy().MemoryBytes != 128<<20 {
		t.Errorf("custom limits: %d starts, memory %d", b.Starts(), instance(custom).Policy().MemoryBytes)
	}
	m.Shutdown()
	if entries, _ := os.ReadDir(filepath.Join(m.cfg.StateDir, "warm")); len(entries) != 0 {
		t.Errorf("warm snapshots left after Shutdown: %v", entries)
	}
}

// A clone that fails marks the save broken: the template's sandboxes are
// started and readied afresh, with no more tries of it.
func TestWarmSnapshotFailedCloneFallsBack(t *testing.T) {
	var readied atomic.Int32
	m, b := persistent(t, Config{Templates: []Template{warmTemplate(&readied, 2)}}, func(b *fake.Backend) {
		b.SetError(fake.OpClone, errors.New("corrupt"))
	})
	waitFor(t, m, "the pool is full", func() bool { return pooledOf(m, "ci") == 2 })
	if b.Clones() != 1 || b.Starts() != 3 || readied.Load() != 3 {
		t.Errorf("%d clones, %d starts, %d readied; want one try, then two started and readied", b.Clones(), b.Starts(), readied.Load())
	}
	if m.metrics.clones.Load() != 0 {
		t.Errorf("%d clones counted", m.metrics.clones.Load())
	}
}

// A save that fails leaves the template's sandboxes started as before.
func TestWarmSnapshotNotMade(t *testing.T) {
	var readied atomic.Int32
	m, b := persistent(t, Config{Templates: []Template{warmTemplate(&readied, 1)}}, func(b *fake.Backend) {
		b.SetError(fake.OpSnapshot, errors.New("disk full"))
	})
	waitFor(t, m, "the pool is full", func() bool { return pooledOf(m, "ci") == 1 })
	if b.Clones() != 0 || b.Starts() != 2 || m.metrics.warmMade.Load() != 0 {
		t.Errorf("%d clones, %d starts, %d made; want the pool started afresh", b.Clones(), b.Starts(), m.metrics.warmMade.Load())
	}
}

// A template with no pool runs no sandbox that no one asked for: its
// creates start afresh; a backend that cannot clone has no warm save.
func TestNoWarmSnapshotWithoutAPoolOrACloner(t *testing.T) {
	var readied atomic.Int32
	m, b := persistent(t, Config{Templates: []Template{warmTemplate(&readied, 0)}})
	create(t, m, CreateRequest{TemplateID: "ci"})
	if b.Clones() != 0 || b.Starts() != 1 {
		t.Errorf("%d clones, %d starts; want one start", b.Clones(), b.Starts())
	}
	tmpl := warmTemplate(&readied, 1)
	tmpl.Backend = plain{b}
	if w := m.warmSnapshot(&tmpl, true); w != nil {
		t.Error("a warm snapshot on a backend that cannot clone")
	}
	if (*warmSnap)(nil).made() {
		t.Error("no warm snapshot is made")
	}
}
