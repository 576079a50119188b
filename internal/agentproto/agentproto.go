// Package agentproto is the contract between the daemon and the agent inside every sandbox.
package agentproto

import "syscall"

// The daemon and the agent are one binary, but not one program: the
// agent runs in the sandbox, the daemon outside it, and neither imports
// the other. What they agree on lives here, and only here.

// Ports the SDKs address inside a sandbox (E2b-Sandbox-Port); the agent
// serves both.
const (
	EnvdPort        = "49983"
	InterpreterPort = "49999"
)

// EnvdVersion is the newest envd version whose features the agent all
// implements; the SDKs switch features on by it (0.4.0 default user, 0.5.7
// octet-stream uploads, 0.6.2 file metadata, 0.6.3 entries in watch events,
// 0.6.4 watching network mounts). envd 0.6.5 and later add only what
// concerns E2B's VMs (heap hugepages, live upgrade, /fsfreeze), none of it
// seen by an SDK.
const EnvdVersion = "0.6.4"

// AgentArg is the command-line argument that makes the airlock binary run
// as a sandbox's agent.
const AgentArg = "agent"

// SocketEnv names the environment variable that tells the agent which
// path to listen on. Without it the agent takes a listening socket as
// file descriptor 3: the daemon hands one over where it can (not into
// gVisor).
const SocketEnv = "AIRLOCK_AGENT_SOCKET"

// ResumeSignal, sent to an agent that let go of its socket for a
// checkpoint (CheckpointPath, answered 204), makes it listen
// again: after the sandbox's restore, or a checkpoint that failed.
const ResumeSignal = syscall.SIGUSR1

// AgentTasks is how many tasks (processes and threads) of a sandbox the
// agent keeps for itself: the backends start it with the sandbox's pids
// limit plus AgentTasks (RLIMIT_NPROC, and the pids cgroup where there is
// one), and every process it starts gets the pids limit alone (package
// agent/tasks). A fork bomb then leaves the agent room to start threads
// (the Go runtime dies when it cannot), so the sandbox outlives it.
const AgentTasks = 32

// PrestartEnv names the environment variable through which a template
// asks the agent to start a kernel of that language at once.
const PrestartEnv = "AIRLOCK_PRESTART_KERNEL"

// PrestartLateEnv names the languages (comma-separated) whose kernels the
// agent starts once the daemon puts the sandbox in a pool (WarmLatePath),
// not at its start: a warm snapshot is saved before that, so that each of
// its clones starts its own. A copy of a running Node kernel would give
// every clone the same Math.random, which V8 seeds once, at its start.
const PrestartLateEnv = "AIRLOCK_PRESTART_LATE"

// SetupPath is the prefix of the agent's private endpoints, the daemon's
// alone: the gateway never forwards a client's request under it. Each
// endpoint's path and its Client method are in private.go.
const SetupPath = "/airlock/"

// FilesCompleteTrailer is the trailer of the agent's answer to GET
// SavedFilesPath (a tar stream of the sandbox's files): "1" once all of
// them were written.
const FilesCompleteTrailer = "Airlock-Files-Complete"

// Setup is what the daemon posts to SetupEnvPath when it hands the
// sandbox out; the agent answers 204 No Content.
type Setup struct {
	EnvVars map[string]string `json:"envVars"`
}

// Disk is the agent's answer on DiskPath.
type Disk struct {
	// Used is what the sandbox's writable file systems (/tmp and the
	// home directory, one or two) hold, in bytes.
	Used int64 `json:"used"`
}
