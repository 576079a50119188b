package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Checkpoints: runsc checkpoint saves the whole sandbox (the Sentry's
// memory, every task, the in-memory file systems: /tmp, the home, an
// image root's writable layer) into the bundle's checkpoint directory and
// ends it; runsc restore starts it again from there, under the same
// bundle, in this process or a later one. What a restore needs besides
// stays in the bundle (its config, the image root's top layer, the
// generated /etc files) or is the policy's (the image's layers, mounted
// again). A bundle whose sandbox is saved has the saved marker: Cleanup
// leaves it, and only Forget removes it.
//
// Snapshots are the same save, made with --leave-running into a directory
// of the caller's: the sandbox runs on, and Clone restores the copy, as
// many times as asked, each into a new bundle of the same policy (the
// same mounts, from new places) under a new container id.
//
// Every save is stamped (stamp.go) with the runsc that made it: runsc
// restores only what the same build of it saved.
const (
	checkpointDir = "checkpoint"
	savedMarker   = "saved"
)

var (
	_ backend.Checkpointer = (*agentSandbox)(nil)
	_ backend.Restorer     = (*Backend)(nil)
	_ backend.Snapshotter  = (*agentSandbox)(nil)
	_ backend.Committer    = (*agentSandbox)(nil)
	_ backend.Cloner       = (*Backend)(nil)
)

// Checkpoint saves the sandbox and ends it (backend.Checkpointer).
func (s *agentSandbox) Checkpoint(ctx context.Context) (string, error) {
	if err := s.awaitAgentRelease(ctx); err != nil {
		s.resumeAgent()
		return "", err
	}
	dir := filepath.Join(s.b.dir, checkpointDir)
	if err := os.RemoveAll(dir); err != nil { // a restored-from, earlier one
		s.resumeAgent()
		return "", err
	}
	if err := s.save(dir); err != nil {
		// A failed save leaves the sandbox running.
		os.RemoveAll(dir)
		s.resumeAgent()
		return "", err
	}
	// runsc run ends with the sandbox; what ran it goes, what restores it
	// stays. It is stamped once the sandbox has ended, so that nothing of
	// it can write there after: a stamp taken as runsc checkpoint
	// returned was, once in a hundred pauses here, not what the files
	// were at the restore ("its files are not those that were saved").
	early, _ := s.be.stampLines(dir)
	<-s.done
	if late, err := s.be.stampLines(dir); err == nil && !slices.Equal(early, late) {
		s.log.Warn("gvisor: the saved files changed after runsc checkpoint returned", "sandbox", s.b.id, "then", early, "now", late)
	}
	if err := s.be.writeStamp(dir); err != nil {
		return "", err // the sandbox has ended: Wait removes it all
	}
	if err := os.WriteFile(filepath.Join(s.b.dir, savedMarker), nil, 0o600); err != nil {
		return "", err
	}
	return s.b.id, s.b.release(s.runsc)
}

// Snapshot saves a copy of the sandbox into dir while it runs on
// (backend.Snapshotter).
func (s *agentSandbox) Snapshot(ctx context.Context, dir string) (err error) {
	// However it ends, the agent listens again: after a save, by itself.
	defer func() {
		if err != nil {
			s.resumeAgent()
		} else {
			go s.awaken(false)
		}
	}()
	if err := s.awaitAgentRelease(ctx); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	err = s.checkpoint(dir, "--leave-running")
	if err != nil {
		os.RemoveAll(dir)
	}
	return err
}

// Clone starts a new sandbox from the snapshot in dir (backend.Cloner).
func (be *Backend) Clone(ctx context.Context, dir string, p policy.Policy, netns *os.File) (backend.Instance, error) {
	if err := be.checkStamp(dir); err != nil {
		return nil, err
	}
	s, err := be.prepare(ctx, p, netns)
	if err != nil {
		return nil, err
	}
	if err := s.restore(dir); err != nil {
		s.b.remove("")
		return nil, err
	}
	return s, nil
}

// awaitAgentRelease waits for the agent, asked to let go of its host
// socket (gVisor cannot save a socket bound on the host), to remove it.
func (s *agentSandbox) awaitAgentRelease(ctx context.Context) error {
	for deadline := time.Now().Add(5 * time.Second); ; {
		if s.agent.absent() {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("the agent did not let go of its socket")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// restore starts the sandbox saved in dir and, in the background, waits
// for its agent to listen.
//
// It runs with at least restoreCPUs until then. A restore loads the
// kernel's state, compiles the Sentry's seccomp filter and copies every
// saved page back at once (runsc's --background: the sandbox starts
// before the last page is in, where a read of one waits for it), and a
// quota of one CPU serialises them: at 1 GiB here, 1.4 s instead of
// 0.9 s. runsc sizes every Sentry for two CPUs at least (fewer makes
// applications drop their locking), so the Sentry sees no difference.
func (s *agentSandbox) restore(dir string) error {
	boosted := false
	if s.b.limits.CPUs < restoreCPUs {
		if err := s.b.cg.SetCPUs(restoreCPUs); err != nil {
			s.log.Warn("gvisor: a restore runs on its sandbox's CPU quota", "sandbox", s.b.id, "err", err)
		} else {
			boosted = true
		}
	}
	if err := s.start("restore", "--background", "--image-path", dir); err != nil {
		return err
	}
	go s.awaken(boosted)
	return nil
}

// restoreCPUs is the CPU quota a restore runs under until its agent
// listens, if its sandbox's is lower.
const restoreCPUs = 2

// awaken waits for the agent of a restored sandbox, or of one that a
// snapshot saved, to listen again. It does by itself once the save's
// end is in (agent/checkpoint); one that does not (an agent saved before
// it could) is sent agentproto.ResumeSignal after resumeGrace, and
// again, backing off: each try is a runsc process. With boosted, the
// sandbox's CPU quota is set back to its own once the agent listens; a
// sandbox that cannot be set back is killed, not left with more.
func (s *agentSandbox) awaken(boosted bool) {
	if boosted {
		defer func() {
			if err := s.b.cg.SetCPUs(s.b.limits.CPUs); err != nil {
				s.log.Error("gvisor: killing a restored sandbox whose CPU quota cannot be set back", "sandbox", s.b.id, "err", err)
				s.Kill(context.Background())
			}
		}()
	}
	start := time.Now()
	signalAt := start.Add(resumeGrace)
	for delay := resumeGrace; ; {
		if s.agent.listening() {
			return
		}
		if time.Now().After(signalAt) {
			s.resumeAgent()
			delay = min(2*delay, 30*time.Second)
			signalAt = time.Now().Add(delay)
		}
		poll := 2 * time.Millisecond // the socket comes at once
		if time.Since(start) > time.Second {
			poll = 25 * time.Millisecond
		}
		select {
		case <-s.done:
			return
		case <-time.After(poll):
		}
	}
}

// resumeGrace is how long a restored agent has to listen by itself.
// It reads the save's end as soon as the restored kernel runs: at 1 GiB
// here, 0.9 s after runsc restore starts.
var resumeGrace = 5 * time.Second

// isSaved reports whether the bundle holds a saved sandbox.
func (s *agentSandbox) isSaved() bool {
	_, err := os.Stat(filepath.Join(s.b.dir, savedMarker))
	return err == nil
}

// resumeAgent tells the agent to listen again (a checkpoint failed, or
// the sandbox was restored).
func (s *agentSandbox) resumeAgent() error {
	return s.b.runsc(s.runsc, nil, "kill", s.b.id, strconv.Itoa(int(agentproto.ResumeSignal))).Run()
}

var savedName = regexp.MustCompile(`^[0-9a-f]{16}$`)

// Restore starts the sandbox saved as name under p (backend.Restorer).
func (be *Backend) Restore(ctx context.Context, name string, p policy.Policy, netns *os.File) (backend.Instance, error) {
	if err := backend.CheckNetNS(&p, netns); err != nil {
		return nil, err
	}
	if !savedName.MatchString(name) {
		return nil, fmt.Errorf("no saved sandbox %q", name)
	}
	dir := filepath.Join(be.stateDir, "bundles", name)
	if _, err := os.Stat(filepath.Join(dir, savedMarker)); err != nil {
		return nil, fmt.Errorf("no saved sandbox %q", name)
	}
	if err := be.checkStamp(filepath.Join(dir, checkpointDir)); err != nil {
		return nil, err
	}
	// As prepare's: the saved sandbox kept its agent's reserve.
	p.Pids += agentproto.AgentTasks
	b, err := be.openBundle(name, &p)
	if err != nil {
		return nil, err
	}
	// The network namespace is the restore's own: runsc joins it by the
	// path in config.json (a descriptor of this process), and its
	// netstack takes the interfaces and routes it finds there.
	b.netns = netns
	if err := setNetNS(b, netns); err != nil {
		b.release("")
		return nil, err
	}
	if len(p.RootLayers) > 0 {
		b.image, b.overlay = true, tmpfsBytes(&p)
		if err := mountOverlay(filepath.Join(dir, "rootfs"), append([]string{filepath.Join(dir, "top")}, p.RootLayers...)); err != nil {
			b.release("")
			return nil, fmt.Errorf("the image's layers: %w", err)
		}
	}
	// The host mounts (volumes) again, where config.json names them: the
	// checkpoint's release unmounted them.
	if _, err := b.userMounts(&p); err != nil {
		b.release("")
		return nil, err
	}
	s, err := be.newAgentSandbox(b, p.Root)
	if err != nil {
		b.release("")
		return nil, err
	}
	if err := s.restore(filepath.Join(dir, checkpointDir)); err != nil {
		b.release("")
		return nil, err
	}
	// What saved it stays until the caller commits the restore.
	return s, nil
}

// Commit removes the saved state the sandbox was restored from
// (backend.Committer): from now on it is a running sandbox like any.
func (s *agentSandbox) Commit() {
	os.Remove(filepath.Join(s.b.dir, savedMarker))
	os.RemoveAll(filepath.Join(s.b.dir, checkpointDir))
}

// Forget removes the saved sandbox name (backend.Restorer).
func (be *Backend) Forget(name string) error {
	if !savedName.MatchString(name) {
		return fmt.Errorf("no saved sandbox %q", name)
	}
	b := &bundle{id: name, dir: filepath.Join(be.stateDir, "bundles", name), stateDir: be.stateDir}
	lock, err := os.OpenFile(filepath.Join(b.dir, "lock"), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		lock.Close()
		return fmt.Errorf("saved sandbox %s is running", name)
	}
	b.lock = lock
	return b.remove(be.runsc)
}

// Saved lists the saved sandboxes (backend.Restorer).
func (be *Backend) Saved() ([]string, error) {
	markers, err := filepath.Glob(filepath.Join(be.stateDir, "bundles", "*", savedMarker))
	var names []string
	for _, m := range markers {
		names = append(names, filepath.Base(filepath.Dir(m)))
	}
	return names, err
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// checkpoint saves the sandbox into dir with runsc's flags and stamps
// what runsc wrote (a copy of a sandbox that runs on).
func (s *agentSandbox) checkpoint(dir string, flags ...string) error {
	if err := s.save(dir, flags...); err != nil {
		return err
	}
	return s.be.writeStamp(dir)
}

// save has runsc save the sandbox into dir with its flags.
func (s *agentSandbox) save(dir string, flags ...string) error {
	args := append(append([]string{"checkpoint"}, flags...), "--image-path", dir, s.b.id)
	if out, err := s.b.runsc(s.runsc, nil, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("runsc checkpoint: %v: %s", err, firstLine(out))
	}
	return nil
}
