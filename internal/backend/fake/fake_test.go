package fake

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// health asks inst's agent for /health and returns the status.
func health(ctx context.Context, inst *Instance) (int, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return inst.Dial(ctx) }}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func start(t *testing.T, b *Backend) *Instance {
	t.Helper()
	inst, err := b.Start(t.Context(), policy.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inst.Kill(context.Background())
		inst.Wait()
	})
	return inst.(*Instance)
}

func TestStartServesTheAgent(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	if code, err := health(t.Context(), inst); err != nil || code != http.StatusNoContent {
		t.Fatalf("health: %d %v, want 204", code, err)
	}
	if got := b.Starts(); got != 1 {
		t.Errorf("Starts() = %d, want 1", got)
	}
	if fi, err := os.Stat(inst.Home()); err != nil || !fi.IsDir() {
		t.Errorf("home %s: %v", inst.Home(), err)
	}
}

func TestKillEndsAndWaitRemoves(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	if err := inst.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := inst.Wait(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inst.Done():
	default:
		t.Fatal("Done is open after Wait")
	}
	if !inst.Killed() || !inst.Waited() {
		t.Errorf("Killed %v Waited %v, want both", inst.Killed(), inst.Waited())
	}
	select {
	case <-inst.Removed():
	default:
		t.Error("Removed is open after Wait")
	}
	if err := inst.Wait(); err != nil {
		t.Errorf("a second Wait: %v", err)
	}
	if _, err := os.Stat(inst.Home()); !os.IsNotExist(err) {
		t.Errorf("home still there after Wait: %v", err)
	}
	if _, err := inst.Dial(t.Context()); !errors.Is(err, ErrEnded) {
		t.Errorf("Dial after the end: %v, want ErrEnded", err)
	}
	if err := inst.Pause(t.Context()); !errors.Is(err, ErrEnded) {
		t.Errorf("Pause after the end: %v, want ErrEnded", err)
	}
	if b.Live() != 0 {
		t.Errorf("Live() = %d, want 0", b.Live())
	}
}

func TestDieEndsWithoutKill(t *testing.T) {
	inst := start(t, New(t.TempDir(), nil))
	inst.Die()
	<-inst.Done()
	if inst.Killed() {
		t.Error("Killed() after Die, want false")
	}
}

func TestPauseBlocksDialUntilResume(t *testing.T) {
	inst := start(t, New(t.TempDir(), nil))
	if err := inst.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := inst.Dial(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial while paused: %v, want the context's deadline", err)
	}
	dialed := make(chan error, 1)
	go func() {
		c, err := inst.Dial(t.Context())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	if err := inst.Resume(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-dialed; err != nil {
		t.Fatalf("Dial across Resume: %v", err)
	}
	if inst.Paused() {
		t.Error("Paused() after Resume")
	}
}

func TestKillWhilePausedEndsDial(t *testing.T) {
	inst := start(t, New(t.TempDir(), nil))
	inst.Pause(t.Context())
	dialed := make(chan error, 1)
	go func() { _, err := inst.Dial(t.Context()); dialed <- err }()
	inst.Kill(t.Context())
	if err := <-dialed; !errors.Is(err, ErrEnded) {
		t.Fatalf("Dial of a paused instance killed: %v, want ErrEnded", err)
	}
}

func TestStartHooks(t *testing.T) {
	b := New(t.TempDir(), nil)
	boom := errors.New("boom")
	b.SetStartError(boom)
	if _, err := b.Start(t.Context(), policy.Default(), nil); !errors.Is(err, boom) {
		t.Errorf("Start with an injected error: %v", err)
	}
	b.SetStartError(nil)
	// A hook holds the start until its context ends.
	entered := make(chan struct{})
	b.SetStartHook(func(ctx context.Context) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan error)
	go func() {
		_, err := b.Start(ctx, policy.Default(), nil)
		started <- err
	}()
	<-entered
	cancel()
	if err := <-started; !errors.Is(err, context.Canceled) {
		t.Errorf("held Start with its context canceled: %v", err)
	}
	if got := b.Starts(); got != 2 {
		t.Errorf("Starts() = %d, want 2 (failed ones count)", got)
	}
	b.SetStartHook(nil)
	b.SetMemory(42 << 20)
	inst := start(t, b)
	if u, _ := inst.Usage(t.Context()); u.Memory != 42<<20 {
		t.Errorf("Usage().Memory = %d, want %d", u.Memory, 42<<20)
	}
	inst.SetUsage(backend.Usage{Memory: 1, CPU: time.Second})
	if u, _ := inst.Usage(t.Context()); u != (backend.Usage{Memory: 1, CPU: time.Second}) {
		t.Errorf("Usage() = %+v after SetUsage", u)
	}
}

func TestRunIsNotSupported(t *testing.T) {
	b := New(t.TempDir(), nil)
	if _, err := b.Run(t.Context(), &backend.Spec{Policy: policy.Default(), Argv: []string{"true"}}); err == nil {
		t.Error("Run succeeded, want an error")
	}
	if b.Name() != "fake" {
		t.Errorf("Name() = %q", b.Name())
	}
}
