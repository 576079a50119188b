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

// The filter's decisions, without a kernel: in particular for syscalls
// this kernel does not have, which a sandbox cannot tell apart from ones
// the filter refuses.
func TestSeccompFilterDecisions(t *testing.T) {
	var prog []bpf.Instruction
	for _, ins := range seccompFilter() {
		prog = append(prog, bpf.RawInstruction{Op: ins.Code, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}.Disassemble())
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
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
