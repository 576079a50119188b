//go:build amd64

package nsinit

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// decide runs the filter, as the kernel would, on one syscall: x/net's BPF
// machine reads words big-endian, so seccomp_data is laid out that way.
func decide(t *testing.T, vm *bpf.VM, arch uint32, nr int, args ...uint32) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[offNr:], uint32(nr))
	binary.BigEndian.PutUint32(data[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[offArg0+8*i:], a) // the low word of each argument
	}
	out, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(out)
}

// filterVM loads the sandbox's filter into x/net's BPF machine.
func filterVM(t *testing.T) *bpf.VM {
	t.Helper()
	var prog []bpf.Instruction
	for _, ins := range seccompFilter() {
		prog = append(prog, bpf.RawInstruction{Op: ins.Code, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}.Disassemble())
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

// The filter's decisions, without a kernel: in particular for syscalls
// this kernel does not have, which a sandbox cannot tell apart from ones
// the filter refuses.
func TestSeccompFilterDecisions(t *testing.T) {
	vm := filterVM(t)
	const allow = unix.SECCOMP_RET_ALLOW
	errno := func(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }
	for _, tc := range []struct {
		name string
		arch uint32
		nr   int
		args []uint32
		want uint32
	}{
		{"getpid", auditArch, unix.SYS_GETPID, nil, allow},
		{"the newest reviewed syscall", auditArch, lastReviewedSyscall, nil, allow},
		{"the first unreviewed syscall", auditArch, lastReviewedSyscall + 1, nil, errno(unix.ENOSYS)},
		{"a far future syscall", auditArch, 1000, nil, errno(unix.ENOSYS)},
		{"x32", auditArch, x32SyscallBit | unix.SYS_GETPID, nil, errno(unix.EPERM)},
		{"i386", unix.AUDIT_ARCH_I386, 20, nil, unix.SECCOMP_RET_KILL_PROCESS},
		{"open_tree_attr", auditArch, unix.SYS_OPEN_TREE_ATTR, nil, errno(unix.EPERM)},
		{"clone3", auditArch, unix.SYS_CLONE3, nil, errno(unix.ENOSYS)},
		{"clone with CLONE_NEWUSER", auditArch, unix.SYS_CLONE, []uint32{unix.CLONE_NEWUSER | 17}, errno(unix.EPERM)},
		{"clone of a thread", auditArch, unix.SYS_CLONE, []uint32{unix.CLONE_VM | unix.CLONE_THREAD}, allow},
		{"socket AF_VSOCK", auditArch, unix.SYS_SOCKET, []uint32{unix.AF_VSOCK}, errno(unix.EAFNOSUPPORT)},
		{"socket AF_INET", auditArch, unix.SYS_SOCKET, []uint32{unix.AF_INET}, allow},
		{"ioctl TIOCSTI", auditArch, unix.SYS_IOCTL, []uint32{0, unix.TIOCSTI}, errno(unix.EPERM)},
	} {
		if got := decide(t, vm, tc.arch, tc.nr, tc.args...); got != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.name, got, tc.want)
		}
	}
}

// Every syscall of the deny list is refused with EPERM, from the x86_64
// ABI; the ones every program makes pass.
func TestSeccompDenyList(t *testing.T) {
	vm := filterVM(t)
	eperm := unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	seen := map[uintptr]bool{}
	for _, nr := range deniedSyscalls {
		if seen[nr] {
			t.Errorf("syscall %d denied twice", nr)
		}
		seen[nr] = true
		if nr > lastReviewedSyscall {
			t.Errorf("syscall %d is denied but newer than the review (%d)", nr, lastReviewedSyscall)
		}
		if got := decide(t, vm, auditArch, int(nr)); got != eperm {
			t.Errorf("denied syscall %d: %#x, want EPERM", nr, got)
		}
	}
	for _, nr := range []int{unix.SYS_READ, unix.SYS_WRITE, unix.SYS_OPENAT, unix.SYS_EXECVE, unix.SYS_MMAP,
		unix.SYS_FUTEX, unix.SYS_WAIT4, unix.SYS_KILL, unix.SYS_CONNECT, unix.SYS_BIND, unix.SYS_GETDENTS64} {
		if got := decide(t, vm, auditArch, nr); got != unix.SECCOMP_RET_ALLOW {
			t.Errorf("syscall %d: %#x, want it allowed", nr, got)
		}
	}
}

// The argument checks: each namespace flag of clone, the socket families
// of socket and socketpair, personality's values, ioctl's requests.
func TestSeccompArguments(t *testing.T) {
	vm := filterVM(t)
	const allow = unix.SECCOMP_RET_ALLOW
	errno := func(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }
	for _, flag := range []uint32{unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWCGROUP} {
		if got := decide(t, vm, auditArch, unix.SYS_CLONE, flag|uint32(unix.SIGCHLD)); got != errno(unix.EPERM) {
			t.Errorf("clone with %#x: %#x, want EPERM", flag, got)
		}
	}
	if got := decide(t, vm, auditArch, unix.SYS_CLONE, uint32(unix.SIGCHLD)); got != allow {
		t.Errorf("a plain fork: %#x", got)
	}
	for _, nr := range []int{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR} {
		for family, want := range map[uint32]uint32{
			unix.AF_UNIX: allow, unix.AF_INET: allow, unix.AF_INET6: allow, unix.AF_NETLINK: allow,
			unix.AF_PACKET: errno(unix.EAFNOSUPPORT), unix.AF_VSOCK: errno(unix.EAFNOSUPPORT),
			unix.AF_ALG: errno(unix.EAFNOSUPPORT), unix.AF_BLUETOOTH: errno(unix.EAFNOSUPPORT),
		} {
			if got := decide(t, vm, auditArch, nr, family); got != want {
				t.Errorf("syscall %d family %d: %#x, want %#x", nr, family, got, want)
			}
		}
	}
	for persona, want := range map[uint32]uint32{
		0: allow, 8: allow, 0x20000: allow, 0x20008: allow, 0xffffffff: allow,
		0x0040000: errno(unix.EPERM), // ADDR_NO_RANDOMIZE
		0x0400000: errno(unix.EPERM), // READ_IMPLIES_EXEC
	} {
		if got := decide(t, vm, auditArch, unix.SYS_PERSONALITY, persona); got != want {
			t.Errorf("personality(%#x): %#x, want %#x", persona, got, want)
		}
	}
	for req, want := range map[uint32]uint32{unix.TIOCSTI: errno(unix.EPERM), unix.TIOCLINUX: errno(unix.EPERM), unix.TCGETS: allow, unix.TIOCGWINSZ: allow} {
		if got := decide(t, vm, auditArch, unix.SYS_IOCTL, 1, req); got != want {
			t.Errorf("ioctl(%#x): %#x, want %#x", req, got, want)
		}
	}
}

// The kernel takes at most BPF_MAXINSNS instructions, and every jump
// must land inside the program: a filter it refuses is no sandbox.
func TestSeccompFilterLoads(t *testing.T) {
	prog := seccompFilter()
	if len(prog) > 4096 {
		t.Fatalf("%d instructions, the kernel takes 4096", len(prog))
	}
	for i, ins := range prog {
		if ins.Code&0x07 == unix.BPF_JMP && i+1+int(max(ins.Jt, ins.Jf)) >= len(prog) {
			t.Errorf("instruction %d jumps past the end", i)
		}
	}
	if last := prog[len(prog)-1]; last.Code != unix.BPF_RET|unix.BPF_K {
		t.Errorf("the program ends with %#x, not a return", last.Code)
	}
}
