package backend

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// AwaitExit returns once p, a child not yet reaped, has ended, without
// holding an OS thread of its own meanwhile; exec.Cmd.Wait then reaps it
// at once. Wait alone blocks in waitid: a daemon of 5,000 idle sandboxes
// kept 5,000 threads parked there, one host task each, and the host's
// task limit is what bounds how many sandboxes it holds. Instead, one
// epoll instance watches the pidfd that os.Process holds for each child
// (readable once the child has ended), from one thread for them all, and
// costs no descriptor per child. Should a step fail, it returns at once,
// and Wait blocks as before.
func AwaitExit(p *os.Process) {
	var ended <-chan struct{}
	if p.WithHandle(func(pidfd uintptr) { ended = watchExit(int(pidfd)) }) != nil || ended == nil {
		return
	}
	<-ended
}

// AwaitPidfd returns once the process of pidfd, which the caller keeps
// open meanwhile, has ended, as AwaitExit does for a child; it reports
// false, at once, if it cannot watch it.
func AwaitPidfd(pidfd int) bool {
	ended := watchExit(pidfd)
	if ended == nil {
		return false
	}
	<-ended
	return true
}

// watchExit adds pidfd to the watcher, or returns nil if it cannot.
func watchExit(pidfd int) <-chan struct{} {
	w, err := exitWatch()
	if err != nil {
		return nil
	}
	ended := make(chan struct{})
	w.mu.Lock()
	if w.broken {
		w.mu.Unlock()
		return nil
	}
	w.next++
	token := w.next
	w.waiting[token] = ended
	w.mu.Unlock()
	// One-shot: once it has fired, the entry stays disabled until the
	// pidfd is closed, which removes it.
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(token), Pad: int32(token >> 32)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		w.mu.Lock()
		delete(w.waiting, token)
		w.mu.Unlock()
		return nil
	}
	return ended
}

// exitWatcher is the epoll instance of AwaitExit and who waits on it.
type exitWatcher struct {
	epfd    int
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan struct{}
	broken  bool // epoll failed: waiters return at once
}

var exitWatch = sync.OnceValues(func() (*exitWatcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	w := &exitWatcher{epfd: epfd, waiting: map[uint64]chan struct{}{}}
	go w.run()
	return w, nil
})

// run tells the waiters whose children ended, for the process's life.
func (w *exitWatcher) run() {
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// Cannot happen with a valid instance; if it did, Wait
			// blocks for each, as without the watcher.
			w.mu.Lock()
			w.broken = true
			for _, ended := range w.waiting {
				close(ended)
			}
			clear(w.waiting)
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		for _, ev := range events[:n] {
			token := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if ended, ok := w.waiting[token]; ok {
				close(ended)
				delete(w.waiting, token)
			}
		}
		w.mu.Unlock()
	}
}
