package process

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Output is read and sent in chunks of at most this size, as envd does.
const chunkSize = 32 << 10

// outputGrace is how long a process's output is still read after it
// exited: a background child that inherited stdout ("sleep 100 &") would
// otherwise hold the command open until the child ends.
const outputGrace = 100 * time.Millisecond

// process is one command started through Start, with its output fanned
// out to every stream currently attached to it.
type process struct {
	info processInfo
	cmd  *exec.Cmd
	pty  *os.File // the master side, for PTY processes

	stdinMu sync.Mutex
	stdin   io.WriteCloser // nil when closed or never opened

	mu   sync.Mutex
	subs map[chan *agentproto.ProcessEvent]struct{}
	done chan struct{} // closed after the end event was delivered
}

// subscribe attaches a new stream to p's events. The channel is closed
// after the end event, or never if unsubscribe comes first. It fails once
// p has ended.
func (p *process) subscribe() (chan *agentproto.ProcessEvent, error) {
	ch := make(chan *agentproto.ProcessEvent, 64)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs == nil {
		return nil, rpc.Errorf(agentproto.CodeNotFound, "process %d has ended", p.info.Pid)
	}
	p.subs[ch] = struct{}{}
	return ch, nil
}

func (p *process) unsubscribe(ch chan *agentproto.ProcessEvent) {
	p.mu.Lock()
	delete(p.subs, ch)
	p.mu.Unlock()
}

// publish delivers ev to every attached stream. A stream that does not
// keep up slows the process's output down (back-pressure, as in envd)
// but never loses events; a detached stream is skipped.
func (p *process) publish(ev *agentproto.ProcessEvent) {
	p.mu.Lock()
	subs := make([]chan *agentproto.ProcessEvent, 0, len(p.subs))
	for ch := range p.subs {
		subs = append(subs, ch)
	}
	p.mu.Unlock()
	for _, ch := range subs {
		for {
			p.mu.Lock()
			_, attached := p.subs[ch]
			p.mu.Unlock()
			if !attached {
				break
			}
			select {
			case ch <- ev:
			case <-time.After(100 * time.Millisecond):
				continue // re-check that the stream is still attached
			}
			break
		}
	}
}

// run streams p's output, waits for it to end and publishes its end; s
// forgets p then.
func (s *Service) run(p *process, outputs []*os.File, kill *time.Timer) {
	var readers sync.WaitGroup
	for i, f := range outputs {
		readers.Go(func() { p.read(f, i) })
	}
	state, waitErr := p.cmd.Process.Wait()
	if kill != nil {
		kill.Stop()
	}
	drain(&readers, outputs)
	p.stdinMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.stdinMu.Unlock()
	s.remove(p)
	p.publish(&agentproto.ProcessEvent{End: endEvent(state, waitErr)})
	p.mu.Lock()
	for ch := range p.subs {
		close(ch)
	}
	p.subs = nil
	p.mu.Unlock()
	close(p.done)
}

// read publishes what f, p's output i (stdout, stderr, or its PTY),
// holds until it ends.
func (p *process) read(f *os.File, i int) {
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			ev := &agentproto.DataEvent{}
			switch {
			case p.pty != nil:
				ev.Pty = chunk
			case i == 0:
				ev.Stdout = chunk
			default:
				ev.Stderr = chunk
			}
			p.publish(&agentproto.ProcessEvent{Data: ev})
		}
		if err != nil {
			return
		}
	}
}

// endEvent is how a process ended, as Wait said.
func endEvent(state *os.ProcessState, waitErr error) *agentproto.EndEvent {
	end := &agentproto.EndEvent{Status: "unknown"}
	if waitErr != nil {
		msg := waitErr.Error()
		end.Error = &msg
		return end
	}
	end.ExitCode = int32(state.ExitCode())
	end.Exited = state.Exited()
	end.Status = state.String()
	if !state.Success() {
		end.Error = &end.Status
	}
	return end
}

// signal sends sig to p's process group (and so to what it started),
// falling back to p alone.
func (p *process) signal(sig unix.Signal) error {
	pid := p.cmd.Process.Pid
	if err := unix.Kill(-pid, sig); err == nil {
		return nil
	}
	if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// drain waits until readers have read outputs to their end, for at most
// outputGrace (a process still running may hold one open: closing the
// read ends ends their blocked reads), and closes outputs.
func drain(readers *sync.WaitGroup, outputs []*os.File) {
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(outputGrace):
		closeFiles(outputs)
		<-drained
	}
	closeFiles(outputs)
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
