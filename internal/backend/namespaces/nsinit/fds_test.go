package nsinit

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Every layout numbers its descriptors from ConfigFD on without a gap or
// a repeat, in the order the host hands them over, with init's binary
// last; a role it has none of takes no number.
func TestFDsLayout(t *testing.T) {
	for cgroups := range 6 {
		for mounts := range 4 {
			for _, layers := range []int{0, 1, 7} {
				for command := range 3 {
					c := &Config{CgroupFiles: cgroups, Mounts: make([]policy.Mount, mounts), Layers: layers, CommandFiles: command}
					l := c.FDs()
					order := []int{l.Config, l.Status}
					order = append(order, l.Cgroups...)
					order = append(order, l.Mounts...)
					if layers > 0 {
						order = append(order, l.Layers)
					} else if l.Layers != -1 {
						t.Errorf("%+v: layers' socket %d without layers", c, l.Layers)
					}
					order = append(order, l.Command...)
					order = append(order, l.Self)
					want := make([]int, len(order))
					for i := range want {
						want[i] = ConfigFD + i
					}
					if !slices.Equal(order, want) {
						t.Errorf("cgroups %d mounts %d layers %d command %d: %v, want %v", cgroups, mounts, layers, command, order, want)
					}
					if len(l.Cgroups) != cgroups || len(l.Mounts) != mounts || len(l.Command) != command {
						t.Errorf("%+v: counts of %+v", c, l)
					}
					if l.Count() != len(want) {
						t.Errorf("Count() = %d, want %d", l.Count(), len(want))
					}
				}
			}
		}
	}
}

// The two descriptors init reads before it knows the layout are fixed.
func TestFDsFixedFirst(t *testing.T) {
	l := (&Config{}).FDs()
	if l.Config != 3 || l.Status != 4 || l.Self != 5 || l.Count() != 3 {
		t.Errorf("empty layout %+v", l)
	}
}

// Whatever config init is given, it either refuses it or finds a layout
// numbered from ConfigFD on without a gap, its binary last.
func FuzzConfigFDs(f *testing.F) {
	for _, c := range []Config{{Argv: []string{"x"}}, {Argv: []string{"x"}, CgroupFiles: 3, Mounts: make([]policy.Mount, 2), Layers: 4, CommandFiles: 1}} {
		data, _ := json.Marshal(&c)
		f.Add(data)
	}
	f.Add([]byte(`{"Argv":["x"],"CgroupFiles":-1}`))
	f.Add([]byte(`{"Argv":["x"],"Layers":-3,"CommandFiles":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil || c.CgroupFiles+len(c.Mounts)+c.CommandFiles > 1<<16 {
			return
		}
		l := c.FDs()
		all := append(append(append([]int{l.Config, l.Status}, l.Cgroups...), l.Mounts...), l.Command...)
		if l.Layers >= 0 {
			all = append(all, l.Layers)
		}
		slices.Sort(all)
		for i, fd := range all {
			if fd != ConfigFD+i {
				t.Fatalf("descriptor %d at %d: %+v", fd, i, l)
			}
		}
		if l.Self != ConfigFD+len(all) || l.Count() != len(all)+1 {
			t.Fatalf("binary at %d, count %d: %+v", l.Self, l.Count(), l)
		}
	})
}
