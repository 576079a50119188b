package layout

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

func TestPaths(t *testing.T) {
	if CodePath("main.py") != "/.airlock/main.py" {
		t.Errorf("CodePath = %q", CodePath("main.py"))
	}
	// What the host places read-only is under CodeDir, which both backends
	// mount as one.
	if !strings.HasPrefix(AgentPath, CodeDir+"/") {
		t.Errorf("AgentPath %s is outside CodeDir", AgentPath)
	}
	for _, list := range [][]string{HostEtc, HostRootLinks} {
		seen := map[string]bool{}
		for _, name := range list {
			if name == "" || strings.Contains(name, "/") || name == "." || name == ".." || seen[name] {
				t.Errorf("%q: not a single, distinct path element", name)
			}
			seen[name] = true
		}
	}
	// Shared from the host, /etc's secrets never are.
	for _, secret := range []string{"shadow", "gshadow", "sudoers", "ssh", "passwd", "group"} {
		if slices.Contains(HostEtc, secret) {
			t.Errorf("HostEtc shares %s", secret)
		}
	}
}

func TestGeneratedEtc(t *testing.T) {
	for _, networked := range []bool{false, true} {
		etc := GeneratedEtc(networked)
		user := fmt.Sprintf("user:x:%d:%d:user:%s:/bin/bash\n", UID, GID, Home)
		if !strings.Contains(string(etc["passwd"]), user) || !strings.HasPrefix(string(etc["passwd"]), "root:x:0:0:") {
			t.Errorf("passwd %q", etc["passwd"])
		}
		if !strings.Contains(string(etc["group"]), fmt.Sprintf("user:x:%d:\n", GID)) {
			t.Errorf("group %q", etc["group"])
		}
		if string(etc["hostname"]) != Hostname+"\n" || !strings.Contains(string(etc["hosts"]), "127.0.0.1\tlocalhost "+Hostname+"\n") {
			t.Errorf("hostname %q hosts %q", etc["hostname"], etc["hosts"])
		}
		resolv, nss := string(etc["resolv.conf"]), string(etc["nsswitch.conf"])
		if networked {
			// The one resolver a sandbox with a network asks: the daemon's.
			if resolv != "nameserver "+Resolver+"\n" || !strings.Contains(nss, "hosts: files dns\n") {
				t.Errorf("networked: resolv.conf %q nsswitch %q", resolv, nss)
			}
		} else if strings.Contains(resolv, "nameserver") || !strings.Contains(nss, "hosts: files\n") {
			t.Errorf("no network: resolv.conf %q nsswitch %q", resolv, nss)
		}
		// The login shell's profile sources nothing of the host's but bashrc.
		if p := string(etc["profile"]); strings.Contains(p, "profile.d") {
			t.Errorf("profile %q", p)
		}
	}
}

func TestEnv(t *testing.T) {
	t.Setenv("OPENBLAS_CORETYPE", "Haswell")
	t.Setenv("AIRLOCK_API_KEY", "secret")
	for _, tc := range []struct {
		cpus    float64
		threads string
	}{{0.5, "1"}, {1, "1"}, {1.5, "2"}, {4, "4"}} {
		p := policy.Default()
		p.CPUs = tc.cpus
		p.Env = []string{"PATH=/opt/bin", "FOO=bar"}
		env := Env(&p)
		for _, want := range []string{"PATH=/opt/bin", "FOO=bar", "HOME=" + Home, "USER=" + User, "LANG=C.UTF-8",
			"OPENBLAS_NUM_THREADS=" + tc.threads, "OMP_NUM_THREADS=" + tc.threads, "OPENBLAS_CORETYPE=Haswell"} {
			if !slices.Contains(env, want) {
				t.Errorf("cpus %v: env %v lacks %s", tc.cpus, env, want)
			}
		}
		for _, kv := range env {
			if strings.HasPrefix(kv, "AIRLOCK_API_KEY=") || kv == "PATH=/usr/local/bin:/usr/bin:/bin" {
				t.Errorf("env has %s", kv)
			}
		}
	}
}

func TestMergeEnv(t *testing.T) {
	base := []string{"A=1", "B=2", "C"}
	got := MergeEnv(base, []string{"B=3", "D=4", "C=5", "A=", "D=6"})
	want := []string{"A=", "B=3", "C=5", "D=6"}
	if !slices.Equal(got, want) {
		t.Errorf("MergeEnv = %v, want %v", got, want)
	}
	if !slices.Equal(base, []string{"A=1", "B=2", "C"}) {
		t.Errorf("base changed: %v", base)
	}
	if got := MergeEnv(nil, nil); len(got) != 0 {
		t.Errorf("MergeEnv(nil, nil) = %v", got)
	}
}
