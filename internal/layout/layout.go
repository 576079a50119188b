// Package layout is what a sandbox looks like from inside, whatever
// isolates it: its users, paths, /etc and environment. Both backends build
// the same box from it, so code cannot tell them apart by these.
package layout

import (
	"fmt"
	"os"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Identities inside the sandbox: code runs as user (UID) in Home.
const (
	UID      = 1000
	GID      = 1000
	User     = "user"
	Home     = "/home/user"
	Hostname = "sandbox"
)

// CodeDir holds what the host places in the sandbox, read-only: the code
// files of airlock run's --file and --code, and the sandbox binary.
const CodeDir = "/.airlock"

// AgentPath is where the sandbox binary (cmd/airlock-sandbox) appears
// inside a sandbox, to run as its agent.
const AgentPath = CodeDir + "/bin/airlock"

// SudoPath is where sandboxes with a root have sudo (the sandbox binary,
// read-only): first in the PATH of every user's login shell.
const SudoPath = "/usr/local/bin/sudo"

// CodePath is where a code file named name appears inside the sandbox.
func CodePath(name string) string { return CodeDir + "/" + name }

// HostEtc are the /etc entries the default template shares read-only:
// what Python, numpy, matplotlib, R and TLS clients read at start. Entries
// missing on the host are skipped; everything else in /etc stays hidden.
var HostEtc = []string{
	"alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "fonts", "matplotlibrc",
	"ssl", "ca-certificates", "localtime", "mime.types", "python3", "python3.11", "python3.12",
	"python3.13", "bash.bashrc", "inputrc", "gai.conf",
	// R's configuration: /usr/lib/R/etc holds only links to it.
	"R",
}

// HostRootLinks are the merged-/usr top-level entries: symlinks on a
// merged-/usr host, which the sandbox mirrors, or directories it shares.
var HostRootLinks = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// Resolver is the DNS server a sandbox with a network asks, the same in
// every sandbox: the daemon answers there for each (package netpolicy).
// It is a link-local address that no policy opens otherwise.
const Resolver = "169.254.0.53"

// CABundle is the system's store of trusted certificates, as Debian and
// Alpine name it: a sandbox with a network finds the host's egress CA
// there (package netpolicy's ca.go), beside its system's roots.
const CABundle = "/etc/ssl/certs/ca-certificates.crt"

// TrustEnv points the clients that read bundles of their own at
// CABundle, for a sandbox whose store holds the system's roots and the
// egress CA: Python's requests reads certifi's otherwise, Node its
// compiled-in roots (to which it adds these).
func TrustEnv() []string {
	return []string{"REQUESTS_CA_BUNDLE=" + CABundle, "NODE_EXTRA_CA_CERTS=" + CABundle}
}

// GeneratedEtc are the /etc files written for each sandbox instead of
// taken from the host: its identities and its network, with a resolver
// when it has one (networked).
func GeneratedEtc(networked bool) map[string][]byte {
	resolv, hosts := "# no network in this sandbox\n", "files"
	if networked {
		resolv, hosts = "nameserver "+Resolver+"\n", "files dns"
	}
	return map[string][]byte{
		"passwd": []byte("root:x:0:0:root:/root:/bin/bash\n" +
			fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/bash\n", User, UID, GID, User, Home) +
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
		"group":         []byte(fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", User, GID)),
		"hosts":         []byte("127.0.0.1\tlocalhost " + Hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
		"hostname":      []byte(Hostname + "\n"),
		"resolv.conf":   []byte(resolv),
		"nsswitch.conf": []byte("passwd: files\ngroup: files\nhosts: " + hosts + "\n"),
		// Every command of the E2B SDK runs in a login shell (bash -l -c):
		// the host's /etc/profile (forks of id, profile.d scripts) would
		// cost each one milliseconds. The environment is already set.
		"profile": []byte("# Airlock sandbox: the environment comes from the sandbox.\n" +
			"if [ -n \"${BASH_VERSION-}\" ] && [ -n \"${PS1-}\" ] && [ -f /etc/bash.bashrc ]; then . /etc/bash.bashrc; fi\n"),
	}
}

// Env is the environment a command starts with under p; p.Env adds to
// and overrides it. Nothing of the host's environment leaks in, except
// the OpenBLAS core-type settings that some CPUs need to compute correctly.
func Env(p *policy.Policy) []string {
	threads := max(1, int(p.CPUs+0.999))
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + Home,
		"USER=" + User,
		"LOGNAME=" + User,
		"SHELL=/bin/bash",
		"LANG=C.UTF-8",
		"MPLBACKEND=Agg",
		fmt.Sprintf("OPENBLAS_NUM_THREADS=%d", threads),
		fmt.Sprintf("OMP_NUM_THREADS=%d", threads),
	}
	for _, k := range []string{"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return MergeEnv(env, p.Env)
}

// MergeEnv returns base with each KEY=VALUE of extra replacing or adding.
func MergeEnv(base, extra []string) []string {
	out := append([]string(nil), base...)
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, b := range out {
			if bk, _, _ := strings.Cut(b, "="); bk == k {
				out[i], replaced = kv, true
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}
