package namespaces

import (
	"fmt"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Every sandbox's init is forked by one OS thread that never exits, for
// two reasons:
//
//   - The parent-death signal that kills a sandbox when airlock dies fires
//     when the forking *thread* exits, not the process; a thread that Go
//     retires (a goroutine that exits while locked to it) would take the
//     sandboxes it forked with it.
//   - For the fork, that thread switches its effective uid to the
//     sandbox's owner uid, so that the new user namespace is owned by an
//     unprivileged host uid and not by root. The kernel charges per-user
//     counts (inotify instances, queued signals, …) of everything inside a
//     user namespace up to its owner: with root as the owner, one sandbox
//     could use up host root's budget.
//
// A sandbox with a network is forked from inside the network namespace
// the host made for it: the thread enters it for the fork and returns to
// its own (spawnerNet) at once.
var (
	spawnOnce  sync.Once
	spawnReq   chan func()
	spawnerNet *os.File // the spawner thread's own network namespace
	spawnErr   error
)

// onSpawner runs f on the spawner thread and waits for it.
func onSpawner(f func()) {
	spawnOnce.Do(func() {
		spawnReq = make(chan func())
		ready := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked
			spawnerNet, spawnErr = os.Open("/proc/thread-self/ns/net")
			close(ready)
			for f := range spawnReq {
				f()
			}
		}()
		<-ready
	})
	done := make(chan struct{})
	spawnReq <- func() { defer close(done); f() }
	<-done
}

// asOwner runs fn on the spawner thread with its effective uid and gid set
// to uid, keeping its capabilities (SECBIT_NO_SETUID_FIXUP), so that fn can
// still write the new namespace's uid and gid maps, and inside network
// namespace netns unless it is nil. The raw syscalls change only this
// thread, which runs nothing else meanwhile.
func asOwner(uid int, netns *os.File, fn func() error) error {
	var err error
	onSpawner(func() {
		if netns != nil {
			if spawnErr != nil {
				err = fmt.Errorf("spawner network namespace: %w", spawnErr)
				return
			}
			if e := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); e != nil {
				err = fmt.Errorf("enter the sandbox's network namespace: %w", e)
				return
			}
			defer restoreNet()
		}
		const noFixup = 1 << 2 // SECBIT_NO_SETUID_FIXUP
		if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, noFixup, 0); e != 0 {
			err = fmt.Errorf("securebits: %w", e)
			return
		}
		keep := ^uintptr(0) // -1: leave unchanged
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(uid), keep); e != 0 {
			restoreRoot()
			err = fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			restoreRoot()
			err = fmt.Errorf("setresuid: %w", e)
			return
		}
		err = fn()
		restoreRoot()
	})
	return err
}

// restoreNet returns the spawner thread to its own network namespace. If
// it could not, later sandboxes without a network would be forked into
// this one's: it stops the process.
func restoreNet() {
	if err := unix.Setns(int(spawnerNet.Fd()), unix.CLONE_NEWNET); err != nil {
		panic(fmt.Sprintf("airlock: cannot return the spawner thread to its network namespace: %v", err))
	}
}

// restoreRoot makes the spawner thread root again. It cannot fail while
// the real and saved uids are 0; if it did, continuing would fork later
// sandboxes with the wrong identity, so it stops the process.
func restoreRoot() {
	keep := ^uintptr(0)
	_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep)
	_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, keep, 0, keep)
	_, _, e3 := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, 0, 0)
	if e1 != 0 || e2 != 0 || e3 != 0 {
		panic(fmt.Sprintf("airlock: cannot restore the spawner thread's identity: %v %v %v", e1, e2, e3))
	}
}
