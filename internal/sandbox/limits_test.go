package sandbox

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

func TestLimitsApply(t *testing.T) {
	tmpl := policy.Default() // 512M memory, 256 pids, 1 CPU, 1G disk
	for _, tc := range []struct {
		name   string
		limits Limits
		want   string // an error containing this, or "" for success
		custom bool
	}{
		{"none: the template's, from the pool", Limits{}, "", false},
		{"the template's own values", Limits{MemoryBytes: 512 << 20, CPUs: 1}, "", false},
		{"lower", Limits{MemoryBytes: 128 << 20, CPUs: 0.5, Pids: 64, DiskBytes: 64 << 20}, "", true},
		{"memory above the template's", Limits{MemoryBytes: 1 << 30}, "memory 1G is above the template's 512M", false},
		{"huge memory", Limits{MemoryBytes: math.MaxInt64}, "above the template's", false},
		{"cpus above", Limits{CPUs: 2}, "cpus 2 is above the template's 1", false},
		{"pids above", Limits{Pids: 1000}, "pids 1000 is above the template's 256", false},
		{"disk above", Limits{DiskBytes: 2 << 30}, "disk 2G is above the template's 1G", false},
		{"too little memory for the agent", Limits{MemoryBytes: 1 << 20}, "memory 1M is below 64M", false},
		{"too few pids", Limits{Pids: 2}, "pids 2 is below 32", false},
		{"negative memory", Limits{MemoryBytes: -1}, "below", false},
		{"negative cpus", Limits{CPUs: -1}, "cpus must be greater than 0", false},
		{"NaN cpus", Limits{CPUs: math.NaN()}, "cpus must be greater than 0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, custom, err := tc.limits.apply(tmpl)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid with %q", err, tc.want)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("a multi-line error: %q", err)
				}
				return
			}
			if err != nil || custom != tc.custom {
				t.Fatalf("custom %v err %v, want custom %v", custom, err, tc.custom)
			}
			if l := tc.limits; l.MemoryBytes != 0 && p.MemoryBytes != l.MemoryBytes || l.CPUs != 0 && p.CPUs != l.CPUs ||
				l.Pids != 0 && p.Pids != l.Pids || l.DiskBytes != 0 && p.DiskBytes != l.DiskBytes {
				t.Errorf("policy %+v does not carry %+v", p, l)
			}
		})
	}
}
