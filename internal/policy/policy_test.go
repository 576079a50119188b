package policy

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"1048576", 1 << 20}, {"512M", 512 << 20}, {"1G", 1 << 30},
		{"64Ki", 64 << 10}, {"2GiB", 2 << 30}, {"1.5M", 3 << 19}, {"1t", 1 << 40},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "M", "-1", "1X", "0x10", "1e3", "NaN", "inf", "99999999999T"} {
		if got, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, got)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Policy)
		want   string // substring of the error; "" for valid
	}{
		{"defaults", func(*Policy) {}, ""},
		{"zero memory", func(p *Policy) { p.MemoryBytes = 0 }, "memory limit"},
		{"negative cpus", func(p *Policy) { p.CPUs = -1 }, "cpus"},
		{"NaN cpus", func(p *Policy) { p.CPUs = math.NaN() }, "cpus"},
		{"zero pids", func(p *Policy) { p.Pids = 0 }, "pids"},
		{"zero timeout", func(p *Policy) { p.Timeout = 0 }, "timeout"},
		{"tiny disk", func(p *Policy) { p.DiskBytes = 10 }, "disk"},
		{"relative workdir", func(p *Policy) { p.Workdir = "home" }, "workdir"},
		{"unclean workdir", func(p *Policy) { p.Workdir = "/home/../etc" }, "workdir"},
		{"env without =", func(p *Policy) { p.Env = []string{"FOO"} }, "KEY=VALUE"},
		{"env empty name", func(p *Policy) { p.Env = []string{"=x"} }, "empty name"},
		{"mount over /proc", func(p *Policy) { p.Mounts = []Mount{{Source: "/x", Target: "/proc/self"}} }, "reserved"},
		{"mount over /", func(p *Policy) { p.Mounts = []Mount{{Source: "/x", Target: "/"}} }, "reserved"},
		{"mount ok", func(p *Policy) { p.Mounts = []Mount{{Source: "/x", Target: "/data"}} }, ""},
		{"mount nested", func(p *Policy) {
			p.Mounts = []Mount{{Source: "/x", Target: "/data"}, {Source: "/y", Target: "/data/sub"}}
		}, "overlap"},
		{"mount twice", func(p *Policy) { p.Mounts = []Mount{{Source: "/x", Target: "/data"}, {Source: "/y", Target: "/data"}} }, "overlap"},
		{"mount under /bin", func(p *Policy) { p.Mounts = []Mount{{Source: "/x", Target: "/bin/x"}} }, "reserved"},
		{"mount relative source", func(p *Policy) { p.Mounts = []Mount{{Source: "x", Target: "/data"}} }, "absolute"},
		{"timeout ok", func(p *Policy) { p.Timeout = time.Millisecond }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Default()
			tc.change(&p)
			err := p.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q spans several lines", err)
			}
		})
	}
}

func TestParseMount(t *testing.T) {
	m, err := ParseMount("./data:/data", "/work")
	if err != nil || m != (Mount{Source: "/work/data", Target: "/data", ReadOnly: true}) {
		t.Fatalf("ParseMount = %+v, %v", m, err)
	}
	m, err = ParseMount("/src:/dst:rw", "/")
	if err != nil || m.ReadOnly {
		t.Fatalf("ParseMount rw = %+v, %v", m, err)
	}
	for _, bad := range []string{"", "/a", ":/b", "/a:", "/a:/b:rx", "/a:/b:ro:x"} {
		if _, err := ParseMount(bad, "/"); err == nil {
			t.Errorf("ParseMount(%q) succeeded, want an error", bad)
		}
	}
}

// FuzzParseSize checks that every accepted size is non-negative and that
// sizes FormatSize prints parse back to the same value.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1", "512M", "1.5G", "64Ki", "-1", "1e9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d, negative", s, n)
		}
		back, err := ParseSize(FormatSize(n))
		if err != nil || back != n {
			t.Fatalf("round trip of %d via %q = %d, %v", n, FormatSize(n), back, err)
		}
	})
}

// FuzzParseMount checks that any mount the parser accepts either validates
// or is refused with a one-line message, never a panic.
func FuzzParseMount(f *testing.F) {
	for _, s := range []string{"./a:/b", "/a:/b:rw", "/a:/proc:ro", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMount(s, "/cwd")
		if err != nil {
			return
		}
		p := Default()
		p.Mounts = []Mount{m}
		if err := p.Validate(); err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error %q", err)
		}
	})
}

func TestWritableBytes(t *testing.T) {
	for _, c := range []struct{ memory, disk, want int64 }{
		{512 << 20, 1 << 30, 384 << 20},   // the defaults: memory bounds it
		{512 << 20, 100 << 20, 100 << 20}, // the disk limit, well inside memory
		{4 << 30, 8 << 30, 3840 << 20},    // the reserve stops growing at 256 MiB
		{16 << 20, 1 << 30, 12 << 20},     // the smallest sandbox
	} {
		p := Default()
		p.MemoryBytes, p.DiskBytes = c.memory, c.disk
		if got := p.WritableBytes(); got != c.want {
			t.Errorf("memory %s, disk %s: writable %s, want %s", FormatSize(c.memory), FormatSize(c.disk), FormatSize(got), FormatSize(c.want))
		}
	}
}
