package interpreter

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestLanguageOf(t *testing.T) {
	for name, want := range map[string]string{
		"": "python", "Python": "python", " python3 ": "python", "js": "javascript", "TS": "typescript",
		"r": "r", "bash": "bash", "java": "java", "javascript": "javascript",
	} {
		l, err := languageOf(name)
		if err != nil || l.name != want {
			t.Errorf("%q: %v, %v; want %s", name, l, err, want)
		}
	}
	if _, err := languageOf("cobol"); err == nil || !strings.Contains(err.Error(), "bash, java, javascript, python, r, typescript") {
		t.Errorf("cobol: %v, want the languages listed", err)
	}
}

// hostile are envs whose values would break code they were spliced into
// unquoted.
var hostile = map[string]string{
	"PLAIN": "v", "QUOTES": `it's "q"`, "NEWLINE": "a\nb", "BACKSLASH": `c:\d\'`, "DOLLAR": "$HOME `id`", "UNICODE": "ключ ✓",
}

// runCode runs code with the interpreter's binary name, or skips t.
func runCode(t *testing.T, bin string, args ...string) string {
	t.Helper()
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Skipf("no %s here", bin)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8") // R escapes what the locale cannot show
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", bin, err, out)
	}
	return string(out)
}

// TestEnvCode: each language's code sets the envs as given, whatever
// they hold, and puts back what was there before.
func TestEnvCode(t *testing.T) {
	check := func(t *testing.T, out string) {
		t.Helper()
		for _, line := range []string{"PLAIN=v", `QUOTES=it's "q"`, "NEWLINE=a|b", `BACKSLASH=c:\d\'`, "DOLLAR=$HOME `id`", "UNICODE=ключ ✓", "AFTER:PLAIN=old,QUOTES=unset"} {
			if !strings.Contains(out, line+"\n") {
				t.Errorf("output lacks %q:\n%s", line, out)
			}
		}
	}
	t.Run("python", func(t *testing.T) {
		l := languages["python"]
		code := "import os\nos.environ['PLAIN'] = 'old'\n" + l.setEnv(hostile) +
			"for k in sorted(" + envJSON(hostile) + "): print(k + '=' + os.environ[k].replace('\\n', '|'))\n" +
			l.restoreEnv + "print('AFTER:PLAIN=' + os.environ['PLAIN'] + ',QUOTES=' + os.environ.get('QUOTES', 'unset'))\n" +
			l.exportEnv(map[string]string{"X": "1"}) + "print(os.environ['X'])\n"
		check(t, runCode(t, "/usr/bin/python3", "-c", code))
	})
	t.Run("bash", func(t *testing.T) {
		l := languages["bash"]
		vars := map[string]string{"BAD NAME": "x", "1X": "y"}
		for k, v := range hostile {
			vars[k] = v
		}
		code := "export PLAIN=old\n" + l.setEnv(vars) +
			"for k in BACKSLASH DOLLAR NEWLINE PLAIN QUOTES UNICODE; do v=${!k}; echo \"$k=${v//$'\\n'/|}\"; done\n" +
			l.restoreEnv + "echo \"AFTER:PLAIN=$PLAIN,QUOTES=${QUOTES-unset}\"\n" + l.exportEnv(map[string]string{"X": "1", "B-AD": "2"}) + "echo $X\n"
		check(t, runCode(t, "bash", "-c", code))
	})
	t.Run("node", func(t *testing.T) {
		// tslab's kernels run each of these as a cell of its own.
		l := onNode(languages["javascript"])
		code := "process.env.PLAIN = 'old'\n" + l.setEnv(hostile) +
			"for (const k of Object.keys(" + envJSON(hostile) + ").sort()) console.log(k + '=' + process.env[k].replaceAll('\\n', '|'))\n" +
			l.restoreEnv + "console.log('AFTER:PLAIN=' + process.env.PLAIN + ',QUOTES=' + (process.env.QUOTES ?? 'unset'))\n" +
			l.exportEnv(map[string]string{"X": "1"}) + "console.log(process.env.X)\n" +
			"console.log(Object.keys(globalThis).filter((k) => k.startsWith('__airlock')).length + ' left')\n"
		out := runCode(t, "node", "-e", code)
		check(t, out)
		if !strings.Contains(out, "1\n0 left\n") {
			t.Errorf("the export or the clean-up failed:\n%s", out)
		}
	})
	t.Run("r", func(t *testing.T) {
		l := languages["r"]
		if out, err := exec.Command("Rscript", "-e", "library(jsonlite)").CombinedOutput(); err != nil {
			t.Skipf("no R with jsonlite: %s", out)
		}
		code := "Sys.setenv(PLAIN='old')\n" + l.setEnv(hostile) +
			"for (k in sort(names(.airlock_env))) cat(k, '=', gsub('\\n', '|', Sys.getenv(k)), '\\n', sep='')\n" +
			l.restoreEnv + "cat('AFTER:PLAIN=', Sys.getenv('PLAIN'), ',QUOTES=', Sys.getenv('QUOTES', unset='unset'), '\\n', sep='')\n"
		check(t, runCode(t, "Rscript", "-e", code))
	})
}

func TestShellNameAndQuote(t *testing.T) {
	for name, ok := range map[string]bool{"A": true, "_a1": true, "1a": false, "": false, "A-B": false, "A B": false, "ключ": false} {
		if shellName(name) != ok {
			t.Errorf("shellName(%q) = %v", name, !ok)
		}
	}
	if got := shellQuote(`it's`); got != `'it'\''s'` {
		t.Errorf("shellQuote: %s", got)
	}
	if got := rString("a'b\\c\nd"); got != `'a\'b\\c\nd'` {
		t.Errorf("rString: %s", got)
	}
}
