//go:build amd64

package nsinit

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Offsets into struct seccomp_data, which the filter reads.
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
	offArg1 = 24
)

// cloneNamespaceFlags are refused in clone(2): the same namespaces unshare
// would create. (CLONE_NEWTIME is absent: in clone's flags that bit is part
// of the exit signal.)
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// seccompFilter builds the sandbox's BPF program. It is a deny list of the
// syscalls up to lastReviewedSyscall and refuses every later one: the
// allow-list alternative breaks arbitrary user programs in ways that are
// hard to explain, while this list removes the syscalls such programs never
// need. The order is significant: the arch check comes first, because
// syscall numbers mean different things in other ABIs.
func seccompFilter() []unix.SockFilter {
	errno := func(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf}
	}
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		// 1. Another ABI (i386 via int 0x80): kill, since numbers differ.
		stmt(ld, offArch),
		jump(jeq, auditArch, 1, 0),
		stmt(ret, unix.SECCOMP_RET_KILL_PROCESS),
		// 2. x32 syscalls share the arch value but set a high bit.
		stmt(ld, offNr),
		jump(jge, x32SyscallBit, 0, 1),
		stmt(ret, errno(unix.EPERM)),
		// 3. clone3 passes flags in memory BPF cannot read; ENOSYS makes
		// libc fall back to clone, whose flags are checked below.
		jump(jeq, unix.SYS_CLONE3, 0, 1),
		stmt(ret, errno(unix.ENOSYS)),
		// 4. Syscalls newer than the deny list was reviewed against: a
		// later kernel's are unknown attack surface (as io_uring once
		// was). ENOSYS, as from an older kernel, makes libc fall back.
		jump(jge, lastReviewedSyscall+1, 0, 1),
		stmt(ret, errno(unix.ENOSYS)),
	}
	// 5. The deny list.
	for _, nr := range deniedSyscalls {
		prog = append(prog, jump(jeq, uint32(nr), 0, 1), stmt(ret, errno(unix.EPERM)))
	}
	// 6. ioctl(TIOCSTI / TIOCLINUX) push input into a terminal; a sandbox
	// must never type into one, whatever terminal it can reach.
	prog = append(prog,
		jump(jeq, unix.SYS_IOCTL, 0, 5),
		stmt(ld, offArg1),
		jump(jeq, unix.TIOCSTI, 2, 0),
		jump(jeq, unix.TIOCLINUX, 1, 0),
		stmt(ret, unix.SECCOMP_RET_ALLOW),
		stmt(ret, errno(unix.EPERM)),
	)
	// 7. Sockets only of the families code uses: a network namespace does
	// not cover the others (AF_VSOCK reaches the hypervisor, AF_ALG the
	// kernel's crypto code). A refused family looks absent to libc.
	prog = append(prog,
		stmt(ld, offNr),
		jump(jeq, unix.SYS_SOCKET, 1, 0),
		jump(jeq, unix.SYS_SOCKETPAIR, 0, 7),
		stmt(ld, offArg0),
		jump(jeq, unix.AF_UNIX, 4, 0),
		jump(jeq, unix.AF_INET, 3, 0),
		jump(jeq, unix.AF_INET6, 2, 0),
		jump(jeq, unix.AF_NETLINK, 1, 0),
		stmt(ret, errno(unix.EAFNOSUPPORT)),
		stmt(ret, unix.SECCOMP_RET_ALLOW),
	)
	// 8. personality: only the harmless values Docker's profile allows; the
	// others turn off ASLR or change how the kernel reads a binary.
	prog = append(prog,
		stmt(ld, offNr),
		jump(jeq, unix.SYS_PERSONALITY, 0, 8),
		stmt(ld, offArg0),
		jump(jeq, 0x0, 5, 0), // PER_LINUX
		jump(jeq, 0x8, 4, 0), // PER_LINUX32
		jump(jeq, 0x20000, 3, 0),
		jump(jeq, 0x20008, 2, 0),
		jump(jeq, 0xffffffff, 1, 0), // query
		stmt(ret, errno(unix.EPERM)),
		stmt(ret, unix.SECCOMP_RET_ALLOW),
	)
	// 9. clone with namespace flags (low 32 bits of arg 0), then allow.
	prog = append(prog,
		stmt(ld, offNr),
		jump(jeq, unix.SYS_CLONE, 0, 3),
		stmt(ld, offArg0),
		jump(jset, cloneNamespaceFlags, 0, 1),
		stmt(ret, errno(unix.EPERM)),
		stmt(ret, unix.SECCOMP_RET_ALLOW),
	)
	return prog
}

// installSeccomp loads the filter into every thread of the process (TSYNC):
// init stays alive next to the user's code and gets the same filter.
// no_new_privs must be set.
func installSeccomp() error {
	prog := seccompFilter()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	tid, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	if tid != 0 { // TSYNC reports the thread it could not synchronize
		return fmt.Errorf("install seccomp filter: thread %d not synchronized", tid)
	}
	return nil
}
