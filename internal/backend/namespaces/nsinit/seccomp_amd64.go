package nsinit

import "golang.org/x/sys/unix"

// auditArch is the only syscall ABI the filter lets through; calls made
// through the i386 (int 0x80) ABI carry another arch value and are killed.
const auditArch = unix.AUDIT_ARCH_X86_64

// x32SyscallBit marks x32-ABI syscalls, which share the x86_64 arch value.
const x32SyscallBit = 0x40000000

// lastReviewedSyscall is the newest syscall deniedSyscalls was reviewed
// against (file_setattr, Linux 6.17); later ones get ENOSYS. Raise it only
// after reading what the new calls do.
const lastReviewedSyscall = unix.SYS_FILE_SETATTR

// deniedSyscalls are refused with EPERM. Code interpreters never need them,
// and they are where kernel exploits and container escapes keep coming from:
// new mounts and namespaces, tracing other processes, eBPF and perf, the
// kernel keyring, userfaultfd (a classic race-widening tool), io_uring,
// loading kernels or modules, and changing host-wide state.
var deniedSyscalls = []uintptr{
	// mounts and file system views
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_OPEN_TREE_ATTR, unix.SYS_MOUNT_SETATTR,
	// namespaces
	unix.SYS_SETNS, unix.SYS_UNSHARE,
	// other processes' memory
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_KCMP, unix.SYS_PIDFD_GETFD,
	// kernel attack surface
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
	unix.SYS_FANOTIFY_INIT, unix.SYS_LOOKUP_DCOOKIE, unix.SYS_USELIB, unix.SYS__SYSCTL,
	// kernels, modules, power and devices
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE, unix.SYS_CREATE_MODULE,
	unix.SYS_REBOOT, unix.SYS_SWAPON, unix.SYS_SWAPOFF,
	unix.SYS_IOPL, unix.SYS_IOPERM,
	// host-wide state
	unix.SYS_ACCT, unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
	unix.SYS_SYSLOG, unix.SYS_VHANGUP, unix.SYS_SETHOSTNAME, unix.SYS_SETDOMAINNAME,
	// NUMA placement: Docker allows it only with CAP_SYS_NICE
	unix.SYS_MBIND, unix.SYS_SET_MEMPOLICY, unix.SYS_MIGRATE_PAGES, unix.SYS_MOVE_PAGES,
	unix.SYS_SET_MEMPOLICY_HOME_NODE,
}
