package interpreter

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"
)

// A language of the code interpreter: the names E2B's SDKs give it, the
// kernels that run it, how they start, and how an execution's envs are
// set and put back.
type language struct {
	name    string   // as contexts report it
	kernels []string // kernelspec names (or declared languages), first found wins
	// args and files start its kernel (jupyter.Options).
	args  []string
	files map[string][]byte
	late  time.Duration // jupyter.Options.LateOutput
	// setEnv is code that sets vars, keeping what they were for
	// restoreEnv, which puts that back; "" where the language cannot.
	setEnv     func(vars map[string]string) string
	restoreEnv string
	// exportEnv is code that sets vars for good: the sandbox's envVars
	// given to a kernel started before them.
	exportEnv func(vars map[string]string) string
}

//go:embed kernels/python_startup.py
var pythonStartup []byte

// languages are those of E2B's code interpreter. JavaScript and
// TypeScript run on Node (tslab's jslab and tslab kernels, as E2B runs
// Node's) where the sandbox has it, else on Deno's one kernel (the jail's).
var languages = map[string]*language{
	"python": {
		name: "python", kernels: []string{"python3", "python"},
		// Plain tracebacks, no ANSI colours (an agent pays for every
		// escape code); full reprs; charts as data and PIL's show().
		args: []string{"--InteractiveShell.colors=NoColor", "--PlainTextFormatter.max_seq_length=0",
			"--IPKernelApp.exec_files=['{dir}/airlock_startup.py']"},
		files:  map[string][]byte{"airlock_startup.py": pythonStartup},
		setEnv: pythonSetEnv, restoreEnv: pythonRestoreEnv, exportEnv: pythonExportEnv,
	},
	"javascript": {name: "javascript", kernels: []string{"jslab", "deno", "javascript"}, late: denoLate, setEnv: denoSetEnv, restoreEnv: denoRestoreEnv, exportEnv: denoExportEnv},
	"typescript": {name: "typescript", kernels: []string{"tslab", "deno", "typescript"}, late: denoLate, setEnv: denoSetEnv, restoreEnv: denoRestoreEnv, exportEnv: denoExportEnv},
	"r":          {name: "r", kernels: []string{"ir", "r"}, setEnv: rSetEnv, restoreEnv: rRestoreEnv, exportEnv: rExportEnv},
	"bash":       {name: "bash", kernels: []string{"bash"}, setEnv: bashSetEnv, restoreEnv: bashRestoreEnv, exportEnv: bashExportEnv},
	"java":       {name: "java", kernels: []string{"java"}},
}

// onNode is lang as run by tslab's kernels, on Node: process.env is the
// environment there.
func onNode(lang *language) *language {
	l := *lang
	l.late, l.setEnv, l.restoreEnv, l.exportEnv = 0, nodeSetEnv, nodeRestoreEnv, nodeExportEnv
	return &l
}

// nodeKernel reports whether spec starts tslab (its JavaScript or
// TypeScript kernel).
func nodeKernel(argv []string) bool {
	return len(argv) > 0 && path.Base(argv[0]) == "tslab"
}

// denoLate: Deno's kernel publishes a cell's result after its idle status
// now and then (19 cells in 200 here, by 0.25 to 0.4 ms): it is waited for
// that long, with room for a loaded host.
const denoLate = 10 * time.Millisecond

// languageAliases are the other names E2B's SDKs accept.
var languageAliases = map[string]string{"js": "javascript", "ts": "typescript", "python3": "python"}

// languageOf returns the language called name ("": python), whatever its
// case.
func languageOf(name string) (*language, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if n == "" {
		n = "python"
	}
	if a, ok := languageAliases[n]; ok {
		n = a
	}
	if l, ok := languages[n]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("unknown language %q: %s", name, strings.Join(slices.Sorted(maps.Keys(languages)), ", "))
}

// envJSON is vars as a JSON object, which every language here can read
// as a literal: no value is ever spliced into code unquoted.
func envJSON(vars map[string]string) string {
	data, _ := json.Marshal(vars)
	return string(data)
}

func pythonSetEnv(vars map[string]string) string {
	return fmt.Sprintf("import os as _airlock_os, json as _airlock_json\n"+
		"_airlock_env = _airlock_json.loads(%q)\n"+
		"_airlock_saved = {k: _airlock_os.environ.get(k) for k in _airlock_env}\n"+
		"_airlock_os.environ.update(_airlock_env)\n", envJSON(vars))
}

func pythonExportEnv(vars map[string]string) string {
	return fmt.Sprintf("import os as _airlock_os, json as _airlock_json\n"+
		"_airlock_os.environ.update(_airlock_json.loads(%q))\n"+
		"del _airlock_os, _airlock_json\n", envJSON(vars))
}

const pythonRestoreEnv = "for _k, _v in _airlock_saved.items():\n" +
	"    if _v is None: _airlock_os.environ.pop(_k, None)\n" +
	"    else: _airlock_os.environ[_k] = _v\n" +
	"del _k, _v, _airlock_saved, _airlock_env\n"

// Deno's process.env is its environment (Deno.env), as Node's is.
func denoSetEnv(vars map[string]string) string {
	return fmt.Sprintf("globalThis.__airlockSaved = Object.entries(%s).map(([k, v]) => { const old = Deno.env.get(k); Deno.env.set(k, v); return [k, old] });\n", envJSON(vars))
}

func denoExportEnv(vars map[string]string) string {
	return fmt.Sprintf("for (const [k, v] of Object.entries(%s)) Deno.env.set(k, v);\n", envJSON(vars))
}

const denoRestoreEnv = "for (const [k, v] of globalThis.__airlockSaved ?? []) { if (v === undefined) Deno.env.delete(k); else Deno.env.set(k, v) }\ndelete globalThis.__airlockSaved;\n"

// Node's: valid JavaScript and TypeScript alike (tslab type-checks a
// TypeScript cell), in a block, so no name is left in the user's scope;
// what was set is kept through Reflect, which TypeScript lets be any.
func nodeSetEnv(vars map[string]string) string {
	return fmt.Sprintf("{ Reflect.set(globalThis, \"__airlockSaved\", Object.entries(%s).map(([k, v]) => { const old = process.env[k]; process.env[k] = v; return [k, old] })) }\n", envJSON(vars))
}

func nodeExportEnv(vars map[string]string) string {
	return fmt.Sprintf("{ for (const [k, v] of Object.entries(%s)) process.env[k] = v }\n", envJSON(vars))
}

const nodeRestoreEnv = "{ for (const [k, v] of Reflect.get(globalThis, \"__airlockSaved\") ?? []) { if (v === undefined) delete process.env[k]; else process.env[k] = v }\n" +
	"Reflect.deleteProperty(globalThis, \"__airlockSaved\") }\n"

func rSetEnv(vars map[string]string) string {
	return fmt.Sprintf(".airlock_env <- jsonlite::fromJSON(%s)\n"+
		".airlock_saved <- Sys.getenv(names(.airlock_env), unset = NA, names = TRUE)\n"+
		"do.call(Sys.setenv, .airlock_env)\n", rString(envJSON(vars)))
}

func rExportEnv(vars map[string]string) string {
	return fmt.Sprintf("do.call(Sys.setenv, jsonlite::fromJSON(%s))\n", rString(envJSON(vars)))
}

const rRestoreEnv = "for (.k in names(.airlock_saved)) { if (is.na(.airlock_saved[[.k]])) Sys.unsetenv(.k) else do.call(Sys.setenv, setNames(list(.airlock_saved[[.k]]), .k)) }\n" +
	"rm(.k, .airlock_env, .airlock_saved)\n"

// rString quotes s as an R string literal.
func rString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(s) + "'"
}

// Bash: names are checked (only names a shell can export), values quoted.
func bashSetEnv(vars map[string]string) string {
	var b strings.Builder
	b.WriteString("__airlock_saved=()\n")
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if !shellName(k) {
			continue
		}
		fmt.Fprintf(&b, "if [ -n \"${%[1]s+x}\" ]; then __airlock_saved+=(\"%[1]s=$%[1]s\"); else __airlock_saved+=(%[1]s); fi\nexport %[1]s=%[2]s\n",
			k, shellQuote(vars[k]))
	}
	return b.String()
}

func bashExportEnv(vars map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if shellName(k) {
			fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(vars[k]))
		}
	}
	return b.String()
}

const bashRestoreEnv = "for __airlock_v in \"${__airlock_saved[@]}\"; do case \"$__airlock_v\" in *=*) export \"$__airlock_v\";; *) unset \"$__airlock_v\";; esac; done\n" +
	"unset __airlock_saved __airlock_v\n"

func shellName(k string) bool {
	if k == "" || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for _, r := range k {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
