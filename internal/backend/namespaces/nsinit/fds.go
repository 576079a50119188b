package nsinit

// The file descriptors the host gives init, after stdin, stdout and stderr.
// The first two are fixed: init reads its config, and with it the layout
// of the rest, from ConfigFD, and reports on StatusFD before it has one.
const (
	ConfigFD = 3 // config JSON, then EOF
	StatusFD = 4 // init's reports to the host, see the Status* bytes
)

// FDs names where each descriptor the host hands init lands. It is
// computed from the config alone (Config.FDs), once on each side: the host
// places every file at the number named here (package namespaces,
// handOver) and init reads each one by its name, so the two cannot drift
// apart as an append order and a sum of counts could.
type FDs struct {
	Config int
	Status int
	// Cgroups are the cgroup v1 "tasks" files init writes its forking
	// thread into (Config.CgroupFiles of them; none on v2).
	Cgroups []int
	// Mounts are the detached mount trees, one per Config.Mounts entry
	// that is not IDMapped (those come on the layers' socket).
	Mounts []int
	// Layers is the socket of the image's layers and the idmapped mounts
	// (layers.go), -1 without either.
	Layers int
	// Command are handed on to the command as its fds 3, 4, …
	// (Config.CommandFiles of them).
	Command []int
	// Self is init's own binary, last of all: the descriptor the host
	// executed it through, which names a host path (/proc/1/fd).
	Self int
}

// FDs is the layout of the descriptors the host hands init for c: in
// order ConfigFD, StatusFD, the cgroup files, the mount trees, the layers'
// socket if the root is an image's or a mount is idmapped, the command's
// files and init's binary.
func (c *Config) FDs() FDs {
	next := StatusFD + 1
	take := func(n int) []int {
		fds := make([]int, n)
		for i := range fds {
			fds[i] = next
			next++
		}
		return fds
	}
	l := FDs{Config: ConfigFD, Status: StatusFD, Layers: -1}
	l.Cgroups = take(c.CgroupFiles)
	l.Mounts = take(len(c.Mounts) - c.idMapped())
	if c.Layers > 0 || c.idMapped() > 0 {
		l.Layers = take(1)[0]
	}
	l.Command = take(c.CommandFiles)
	l.Self = take(1)[0]
	return l
}

// idMapped is how many of c's mounts are idmapped: made by the host for
// this process's user namespace once it exists, so sent on the layers'
// socket after the image's layers.
func (c *Config) idMapped() int {
	n := 0
	for _, m := range c.Mounts {
		if m.IDMapped {
			n++
		}
	}
	return n
}

// Count is how many descriptors the layout has, from ConfigFD to Self.
func (l FDs) Count() int { return l.Self - ConfigFD + 1 }
