package jupyter

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Spec is a kernelspec (kernel.json).
type Spec struct {
	Argv        []string          `json:"argv"`
	DisplayName string            `json:"display_name"`
	Language    string            `json:"language"`
	Env         map[string]string `json:"env"`
}

// KernelDirs are where kernelspecs are looked for, as Jupyter does.
var KernelDirs = []string{"/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels"}

// FindSpec returns the first installed kernelspec of names: a kernel
// directory of that name, or else a spec declaring it as its language.
func FindSpec(names ...string) (*Spec, error) {
	specs := map[string]*Spec{}     // by directory
	languages := map[string]*Spec{} // by declared language, first found
	for _, dir := range KernelDirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(dir, e.Name(), "kernel.json"))
			if err != nil {
				continue
			}
			var s Spec
			if json.Unmarshal(data, &s) != nil || len(s.Argv) == 0 {
				continue
			}
			name := strings.ToLower(e.Name())
			if specs[name] == nil {
				specs[name] = &s
			}
			if l := strings.ToLower(s.Language); languages[l] == nil {
				languages[l] = &s
			}
		}
	}
	for _, n := range names {
		if s := specs[strings.ToLower(n)]; s != nil {
			return s, nil
		}
	}
	for _, n := range names {
		if s := languages[strings.ToLower(n)]; s != nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no Jupyter kernel for %s is installed", names[0])
}
