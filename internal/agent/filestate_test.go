package agent

import (
	"os"
	"testing"
)

// Entries of a saved file state land in the saved directories only.
func TestFileStateEntry(t *testing.T) {
	home, tmp := &os.Root{}, &os.Root{}
	roots := map[string]*os.Root{"home/user": home, "tmp": tmp}
	for name, want := range map[string]struct {
		root *os.Root
		rel  string
	}{
		"home/user":             {home, "."},
		"home/user/a/b.txt":     {home, "a/b.txt"},
		"tmp/x":                 {tmp, "x"},
		"/tmp/x":                {nil, ""}, // absolute: not what getFileState writes
		"home/user/../../etc":   {nil, ""},
		"home/userx/a":          {nil, ""},
		"home":                  {nil, ""},
		"../tmp/x":              {nil, ""},
		"etc/passwd":            {nil, ""},
		"tmp/../home/user/.ssh": {home, ".ssh"},
	} {
		root, rel, ok := fileStateEntry(roots, name)
		if ok != (want.root != nil) || root != want.root || rel != want.rel {
			t.Errorf("%q: got %v %q %v, want %q", name, root == home, rel, ok, want.rel)
		}
	}
}
