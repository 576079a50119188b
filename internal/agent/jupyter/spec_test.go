package jupyter

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// kernelDirs installs kernelspecs (directory name → kernel.json) in two
// temporary kernel directories for the test.
func kernelDirs(t *testing.T, first, second map[string]string) {
	t.Helper()
	old := KernelDirs
	t.Cleanup(func() { KernelDirs = old })
	KernelDirs = nil
	for _, specs := range []map[string]string{first, second} {
		dir := t.TempDir()
		for name, spec := range specs {
			os.MkdirAll(filepath.Join(dir, name), 0o755)
			if err := os.WriteFile(filepath.Join(dir, name, "kernel.json"), []byte(spec), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		KernelDirs = append(KernelDirs, dir)
	}
}

func TestFindSpec(t *testing.T) {
	kernelDirs(t, map[string]string{
		"Python3": `{"argv":["py1"],"language":"python"}`,
		"broken":  `{"argv":`,
		"noargv":  `{"argv":[],"language":"ruby"}`,
		"deno":    `{"argv":["deno"],"language":"typescript"}`,
	}, map[string]string{
		"python3": `{"argv":["py2"],"language":"python"}`,
		"ir":      `{"argv":["R"],"language":"R","env":{"A":"1"}}`,
	})
	for _, tc := range []struct {
		names []string
		argv  string // "": none found
	}{
		{[]string{"python3"}, "py1"},       // a directory's name, any case; the first directory wins
		{[]string{"python"}, "py1"},        // a declared language
		{[]string{"ir", "r"}, "R"},         // the first name found
		{[]string{"nope", "deno"}, "deno"}, // directory names before languages
		{[]string{"javascript", "deno"}, "deno"},
		{[]string{"r"}, "R"},
		{[]string{"ruby"}, ""}, // no argv: not a kernel
		{[]string{"broken"}, ""},
		{[]string{"cobol"}, ""},
	} {
		s, err := FindSpec(tc.names...)
		switch {
		case tc.argv == "" && err == nil:
			t.Errorf("%v: found %+v", tc.names, s)
		case tc.argv != "" && (err != nil || !slices.Equal(s.Argv, []string{tc.argv})):
			t.Errorf("%v: %+v, %v; want argv %s", tc.names, s, err, tc.argv)
		}
	}
	if _, err := FindSpec("cobol", "fortran"); err == nil || err.Error() != "no Jupyter kernel for cobol is installed" {
		t.Errorf("none: %v", err)
	}
}
