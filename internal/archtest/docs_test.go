package archtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/airlock-sandbox/airlock/internal/config"
)

// The docs are the markdown files at the root (README.md, SECURITY.md)
// and every page under docs/: what a newcomer reads. A doc that names a file
// that moved, a make target, command or flag that was renamed, or a
// config key that is gone, misleads; these tests find such names
// mechanically and look each up in the tree, the Makefile, the commands'
// flag registrations and the config's schema.

// TestDocsNameWhatExists checks every doc against the tree.
func TestDocsNameWhatExists(t *testing.T) {
	ix := newDocIndex(t)
	docs := docFiles(t, ix.root)
	if !slices.Contains(docs, "README.md") || !slices.Contains(docs, "SECURITY.md") {
		t.Fatalf("docs found: %v; want README.md and SECURITY.md among them", docs)
	}
	configBlocks := 0
	documented := map[string]bool{}
	for _, doc := range docs {
		b, err := os.ReadFile(filepath.Join(ix.root, doc))
		if err != nil {
			t.Fatal(err)
		}
		r := ix.check(doc, string(b))
		for _, p := range r.problems {
			t.Errorf("%s", p)
		}
		configBlocks += len(r.configs)
		for k := range r.configKeys {
			documented[k] = true
		}
	}
	// The config example is checked key by key; it must exist, and name
	// every key, or a key could be added and never documented.
	if configBlocks == 0 {
		t.Errorf("no doc has a config example (a json block after %q)", configMarker)
	}
	for _, k := range configKeys(ix.config, "") {
		if !documented[k] {
			t.Errorf("config key %s is in no doc's config example (after %q)", k, configMarker)
		}
	}
}

// TestDocsCheckFindsBadNames proves the checker: each bad snippet is a
// doc naming something made up, and must be reported; each good one
// names what exists, and must not be.
func TestDocsCheckFindsBadNames(t *testing.T) {
	ix := newDocIndex(t)
	bad := []struct{ doc, text, want string }{
		{"README.md", "see `internal/nosuch/nosuch.go`", "no such file"},
		{"README.md", "see `internal/sandbox/nosuch.go`", "no such file"},
		{"docs/x.md", "the checks (`nosuchfile.go`)", "no file of the repository"},
		{"README.md", "run `make nosuch-target`", "make target"},
		{"README.md", "```sh\nmake build nosuch-target\n```", "make target"},
		{"README.md", "`airlock nosuch`", "airlock nosuch"},
		{"README.md", "`airlock run --nosuch 1 -- true`", "--nosuch"},
		{"README.md", "```sh\nairlock serve --pool-sizes 3   # pools\n```", "--pool-sizes"},
		{"README.md", "```sh\n$ bin/airlock mcp --listen :1\n```", "--listen"},
		{"README.md", "`airlock template nosuch app`", "airlock template nosuch"},
		{"README.md", "`airlock template pull|fetch`", "airlock template fetch"},
		{"README.md", "`airlock run --node-name x`", "--node-name"},
		{"README.md", "the flag `--nosuch-flag`", "--nosuch-flag"},
		{"README.md", "[the API](docs/nosuch.md)", "docs/nosuch.md"},
		{"docs/x.md", "[up](../nosuch.md)", "nosuch.md"},
		{"README.md", "[design](../shared/DESIGN.md)", "outside the repository"},
		{"README.md", "# Title\n\nsee [below](#nosuch)", "#nosuch"},
		{"README.md", "see [networks](SECURITY.md#nosuch-section)", "#nosuch-section"},
		{"README.md", "`TestNoSuchThingAnywhere`", "TestNoSuchThingAnywhere"},
		{"README.md", "`FuzzNoSuchParser`", "FuzzNoSuchParser"},
		{"README.md", "`policy.NoSuchThing`", "policy.NoSuchThing"},
		{"README.md", "`policy.Network.NoSuchMethod`", "policy.Network.NoSuchMethod"},
		{"README.md", "`builds.nosuchKey`", "builds.nosuchKey"},
		{"README.md", "`templates.<name>.poolSizes`", "templates.<name>.poolSizes"},
		{"README.md", configMarker + "\n```json\n{\"listen\": \"127.0.0.1:1\", \"nosuchKey\": 1}\n```", "nosuchKey"},
		{"README.md", configMarker + "\n```json\n{\"network\": {\"dnsRates\": \"1/s\"}}\n```", "network.dnsRates"},
		{"README.md", configMarker + "\n```json\n{\"templates\": {\"base\": {\"pools\": 1}}}\n```", "templates.base.pools"},
		{"README.md", configMarker + "\n```json\n{\"listen\": \n```", "not valid JSON"},
		{"README.md", configMarker + "\n```json\n{\"defaultTimeout\": \"soon\"}\n```", "soon"},
		{"README.md", configMarker + "\n```json\n{\"maxSandboxes\": \"many\"}\n```", "maxSandboxes"},
	}
	for _, c := range bad {
		r := ix.check(c.doc, c.text)
		if len(r.problems) != 1 || !strings.Contains(r.problems[0], c.want) {
			t.Errorf("%s: %q: got problems %q, want one naming %q", c.doc, c.text, r.problems, c.want)
		}
	}
	good := []struct{ doc, text string }{
		{"README.md", "`internal/sandbox`, `internal/backend/gvisor/agentdir.go`, `nsinit/seccomp.go`, `deploy/kubernetes`"},
		{"README.md", "`make test`, `make bench-run`, `make`"},
		{"README.md", "```sh\nmake serve   # runs airlock serve\nmake test\n```"},
		{"README.md", "`airlock run --net internet --allow-out pypi.org -- python3 -c 'print(1)' --nosuch`"},
		{"README.md", "`airlock template pull|import|build`, `airlock template build app -f Dockerfile [--context DIR] [--no-cache]`"},
		{"README.md", "```sh\necho x | airlock run --stdin --file e.py   # a comment --nosuch\n```"},
		{"README.md", "`airlock serve --node-name n`, `airlock router --kubeconfig k`, `airlock --version`, `airlock`"},
		{"README.md", "`--pool-size`, `--state-dir`, `-f`, `---`, `-1`, `airlock run ---x -1`"},
		{"docs/x.md", "[up](../README.md), [security](../SECURITY.md#threat-model), ![shot](console-playground.png)"},
		{"README.md", "## The two `make` commands\n\n[them](#the-two-make-commands)"},
		{"README.md", "`TestImports`, `FuzzParseRule`, `policy.Network.OpenInternet`, `config.Resolve`, `console.log`"},
		{"README.md", "`builds.privateRegistries`, `templates.<name>.poolSize`, `network.allowOut`, `/usr/local/bin/sudo`, `<state-dir>/api-key`"},
		{"README.md", configMarker + "\n```json\n{\"templates\": {\"base\": {\"memory\": \"512M\"}}, \"network\": {\"dnsRate\": \"1/s\"}}\n```"},
	}
	for _, c := range good {
		if r := ix.check(c.doc, c.text); len(r.problems) != 0 {
			t.Errorf("%s: %q: got problems %q, want none", c.doc, c.text, r.problems)
		}
	}
}

// TestThirdPartyLicensesComplete: THIRD_PARTY_LICENSES.md lists, at
// their versions, exactly the Go modules the three binaries link and the
// production npm packages of the console they embed, each with a
// licence, so that a new or upgraded dependency gets its licence read
// before it ships.
func TestThirdPartyLicensesComplete(t *testing.T) {
	type dep struct{ name, version string }
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "THIRD_PARTY_LICENSES.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[dep]string{} // → its licence, from the tables' rows
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\| `([^`]+)` \\| ([^|]*) \\|")
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		listed[dep{m[1], m[2]}] = strings.TrimSpace(m[3])
	}

	want := map[dep]string{} // → where it comes from
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command lists the binaries' modules: %v", err)
	}
	// As make build builds them: static, for this platform.
	cmd := exec.Command(goBin, "list", "-deps", "-f",
		"{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{with .Replace}} {{.Path}} {{.Version}}{{end}}{{end}}{{end}}",
		"./cmd/airlock", "./cmd/airlock-sandbox", "./cmd/airlock-cluster")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch f := strings.Fields(line); len(f) {
		case 0:
		case 2:
			want[dep{f[0], f[1]}] = "a Go module the binaries link"
		case 4: // replaced: what is linked is the replacement
			want[dep{f[2], f[3]}] = "a Go module the binaries link"
		default:
			t.Fatalf("go list: unexpected line %q", line)
		}
	}
	if len(want) < 10 {
		t.Fatalf("go list reported only %d modules: %s", len(want), out)
	}

	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
			Dev     bool   `json:"dev"`
		} `json:"packages"`
	}
	b, err = os.ReadFile(filepath.Join(root, "console", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &lock); err != nil {
		t.Fatalf("console/package-lock.json: %v", err)
	}
	npm := 0
	for key, p := range lock.Packages {
		// node_modules/a, node_modules/@s/b, node_modules/a/node_modules/c
		i := strings.LastIndex(key, "node_modules/")
		if i < 0 || p.Dev {
			continue // the console itself, or a build tool
		}
		want[dep{key[i+len("node_modules/"):], p.Version}] = "a production npm package of the console"
		npm++
	}
	if npm == 0 {
		t.Fatal("console/package-lock.json has no production package")
	}

	for d, from := range want {
		if _, ok := listed[d]; !ok {
			t.Errorf("THIRD_PARTY_LICENSES.md does not list %s %s (%s): add its row, \"| `%s` | `%s` | LICENCE |\", with the licence its licence file states",
				d.name, d.version, from, d.name, d.version)
		}
	}
	for d, licence := range listed {
		if _, ok := want[d]; !ok {
			t.Errorf("THIRD_PARTY_LICENSES.md lists %s %s, which no binary links and the console does not depend on: remove its row (or correct its version)", d.name, d.version)
		}
		if licence == "" {
			t.Errorf("THIRD_PARTY_LICENSES.md: %s %s has no licence", d.name, d.version)
		}
	}
}

// configMarker, on the line before a json block, marks it as an example
// of airlock serve's config file, whose keys are checked.
const configMarker = "<!-- airlock config -->"

// docIndex is what a doc may name: the tree, the Makefile, the commands,
// the tests, the packages' names and the config's schema.
type docIndex struct {
	root     string
	files    []string // every file of the repository, slash-separated, relative to root
	topDirs  map[string]bool
	targets  map[string]bool
	commands map[string]*command        // airlock's commands
	flags    map[string]bool            // every flag of any airlock command
	tests    map[string]bool            // Test, Fuzz and Benchmark functions
	decls    map[string]map[string]bool // package name → its declared names
	config   reflect.Type
}

// command is one of airlock's commands: its subcommands (template's)
// and its flags.
type command struct {
	subs  map[string]bool
	flags map[string]bool
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	return root
}

// docFiles are the markdown files at the root and under docs/.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	var docs []string
	for _, pattern := range []string{"*.md", "docs/*.md", "docs/*/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range m {
			rel, _ := filepath.Rel(root, p)
			docs = append(docs, filepath.ToSlash(rel))
		}
	}
	return docs
}

// skipDir: what is not the repository's source (build output, caches,
// installed packages).
func skipDir(root, p string, d fs.DirEntry) bool {
	name := d.Name()
	return p != root && (strings.HasPrefix(name, ".") && name != ".ci" || name == "node_modules" ||
		filepath.Dir(p) == root && name == "bin")
}

func newDocIndex(t *testing.T) *docIndex {
	t.Helper()
	ix := &docIndex{
		root:    repoRoot(t),
		topDirs: map[string]bool{},
		targets: map[string]bool{},
		flags:   map[string]bool{},
		tests:   map[string]bool{},
		decls:   map[string]map[string]bool{},
		config:  reflect.TypeFor[config.Config](),
	}
	entries, err := os.ReadDir(ix.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !skipDir(ix.root, filepath.Join(ix.root, e.Name()), e) {
			ix.topDirs[e.Name()] = true
		}
	}
	fset := token.NewFileSet()
	var goFiles []*ast.File
	var goPaths []string
	err = filepath.WalkDir(ix.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(ix.root, p, d) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(ix.root, p)
		rel = filepath.ToSlash(rel)
		ix.files = append(ix.files, rel)
		if !strings.HasSuffix(p, ".go") || strings.Contains(rel, "/testdata/") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, "_test.go") {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && testFunc.MatchString(fd.Name.Name) {
					ix.tests[fd.Name.Name] = true
				}
			}
			return nil
		}
		goFiles, goPaths = append(goFiles, f), append(goPaths, rel)
		ix.addDecls(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ix.readMakefile(t)
	ix.readCommands(t, goFiles, goPaths)
	return ix
}

// testFunc is the name of a test, fuzzer or benchmark.
var testFunc = regexp.MustCompile(`^(Test|Fuzz|Benchmark)[A-Z0-9_]\w*$`)

// addDecls records a package's top-level names, and Type.Method and
// Type.Field, under its package name.
func (ix *docIndex) addDecls(f *ast.File) {
	pkg := f.Name.Name
	if pkg == "main" {
		return
	}
	names := ix.decls[pkg]
	if names == nil {
		names = map[string]bool{}
		ix.decls[pkg] = names
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				names[d.Name.Name] = true
				continue
			}
			typ := d.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if g, ok := typ.(*ast.IndexExpr); ok {
				typ = g.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				names[id.Name+"."+d.Name.Name] = true
			}
			// Docs name a method by its package too: policy.WritableBytes.
			names[d.Name.Name] = true
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					names[s.Name.Name] = true
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								names[s.Name.Name+"."+n.Name] = true
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
}

// readMakefile finds the Makefile's targets: .PHONY's and every rule's.
func (ix *docIndex) readMakefile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(ix.root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	rule := regexp.MustCompile(`^([A-Za-z0-9_./$()-][A-Za-z0-9_./$() -]*):([^=]|$)`)
	for _, line := range strings.Split(string(b), "\n") {
		if m := rule.FindStringSubmatch(line); m != nil {
			for _, name := range strings.Fields(m[1]) {
				if !strings.Contains(name, "$") {
					ix.targets[name] = true
				}
			}
		}
		if rest, ok := strings.CutPrefix(line, ".PHONY:"); ok {
			for _, name := range strings.Fields(rest) {
				ix.targets[name] = true
			}
		}
	}
	delete(ix.targets, ".PHONY")
	if !ix.targets["test"] || !ix.targets["serve"] {
		t.Fatalf("Makefile targets found: %v; want test and serve among them", ix.targets)
	}
}

// funcInfo is what one function does with flags and commands.
type funcInfo struct {
	flagSets  []string          // names given to flag.NewFlagSet
	flags     []string          // flags it registers on a flag set
	calls     []string          // names of the functions it calls
	takesSet  bool              // it has a *flag.FlagSet parameter: a helper that registers flags
	dispatch  map[string]string // a switch on args[0]: case → the function it calls
	inAirlock bool              // it is in cmd/airlock
}

// flagMethods are flag.FlagSet's registration methods, with the index of
// the flag's name among their arguments.
var flagMethods = map[string]int{
	"String": 0, "Bool": 0, "Int": 0, "Int64": 0, "Uint": 0, "Uint64": 0, "Float64": 0, "Duration": 0,
	"Func": 0, "BoolFunc": 0,
	"StringVar": 1, "BoolVar": 1, "IntVar": 1, "Int64Var": 1, "UintVar": 1, "Uint64Var": 1,
	"Float64Var": 1, "DurationVar": 1, "Var": 1, "TextVar": 1,
}

// readCommands finds airlock's commands in the source rather than by
// running a binary: the switch on args[0] that dispatches them (and the
// one below it, template's), and for each command the flags registered
// in the function it calls, in any function that makes a flag set of
// the command's name (airlock router's are airlock-cluster's), and in
// the helpers those pass their flag set to.
func (ix *docIndex) readCommands(t *testing.T, files []*ast.File, paths []string) {
	funcs := map[string][]*funcInfo{}
	for i, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			fi := inspectFunc(fd)
			fi.inAirlock = path.Dir(paths[i]) == "cmd/airlock"
			funcs[fd.Name.Name] = append(funcs[fd.Name.Name], fi)
		}
	}
	// The root switch: one in cmd/airlock no other switch leads to.
	targets := map[string]bool{}
	for _, fis := range funcs {
		for _, fi := range fis {
			for _, to := range fi.dispatch {
				targets[to] = true
			}
		}
	}
	var roots []map[string]string
	for name, fis := range funcs {
		for _, fi := range fis {
			if fi.inAirlock && len(fi.dispatch) > 0 && !targets[name] {
				roots = append(roots, fi.dispatch)
			}
		}
	}
	if len(roots) != 1 {
		t.Fatalf("found %d switches on args[0] in cmd/airlock that no other leads to, want airlock's one command switch", len(roots))
	}
	// A command's flags: registered in fi, and in the helpers it calls.
	var collect func(fi *funcInfo, into map[string]bool, seen map[*funcInfo]bool)
	collect = func(fi *funcInfo, into map[string]bool, seen map[*funcInfo]bool) {
		if seen[fi] {
			return
		}
		seen[fi] = true
		for _, f := range fi.flags {
			into[f] = true
		}
		for _, c := range fi.calls {
			for _, h := range funcs[c] {
				if h.takesSet {
					collect(h, into, seen)
				}
			}
		}
	}
	ix.commands = map[string]*command{}
	for name, fn := range roots[0] {
		c := &command{subs: map[string]bool{}, flags: map[string]bool{"h": true, "help": true}}
		for _, fi := range funcs[fn] {
			if !fi.inAirlock {
				continue
			}
			collect(fi, c.flags, map[*funcInfo]bool{})
			for sub := range fi.dispatch {
				c.subs[sub] = true
			}
		}
		for _, fis := range funcs {
			for _, fi := range fis {
				if slices.Contains(fi.flagSets, name) {
					collect(fi, c.flags, map[*funcInfo]bool{})
				}
			}
		}
		ix.commands[name] = c
		for f := range c.flags {
			ix.flags[f] = true
		}
	}
	for _, want := range []string{"run", "serve", "mcp", "template", "router"} {
		if ix.commands[want] == nil {
			t.Fatalf("airlock's commands found: %v; want %s among them", slices.Sorted(maps.Keys(ix.commands)), want)
		}
	}
	if !ix.commands["run"].flags["net"] || !ix.commands["router"].flags["kubeconfig"] || !ix.commands["serve"].flags["node-name"] {
		t.Fatalf("flags found: run %v, router %v, serve %v: the reader of flag registrations is broken",
			ix.commands["run"].flags, ix.commands["router"].flags, ix.commands["serve"].flags)
	}
}

func inspectFunc(fd *ast.FuncDecl) *funcInfo {
	fi := &funcInfo{}
	for _, p := range fd.Type.Params.List {
		if s, ok := p.Type.(*ast.StarExpr); ok {
			if sel, ok := s.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "FlagSet" {
				fi.takesSet = true
			}
		}
	}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			var name string
			switch fn := n.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				name = fn.Sel.Name
				if x, ok := fn.X.(*ast.Ident); ok && x.Name == "flag" && name == "NewFlagSet" && len(n.Args) > 0 {
					if s, ok := stringLit(n.Args[0]); ok {
						fi.flagSets = append(fi.flagSets, s)
					}
				}
				if i, ok := flagMethods[name]; ok && len(n.Args) > i {
					if s, ok := stringLit(n.Args[i]); ok {
						fi.flags = append(fi.flags, s)
					}
				}
			}
			if name != "" {
				fi.calls = append(fi.calls, name)
			}
		case *ast.SwitchStmt:
			if !isArgsZero(n.Tag) {
				return true
			}
			if fi.dispatch == nil {
				fi.dispatch = map[string]string{}
			}
			for _, s := range n.Body.List {
				cc := s.(*ast.CaseClause)
				to := firstCall(cc.Body)
				for _, e := range cc.List {
					if label, ok := stringLit(e); ok {
						fi.dispatch[label] = to
					}
				}
			}
		}
		return true
	})
	return fi
}

// isArgsZero: the expression is x[0], as in switch args[0].
func isArgsZero(e ast.Expr) bool {
	ix, ok := e.(*ast.IndexExpr)
	if !ok {
		return false
	}
	lit, ok := ix.Index.(*ast.BasicLit)
	_, isIdent := ix.X.(*ast.Ident)
	return ok && isIdent && lit.Value == "0"
}

// firstCall is the name of the first function a case's body calls.
func firstCall(body []ast.Stmt) string {
	var name string
	for _, s := range body {
		ast.Inspect(s, func(n ast.Node) bool {
			if name != "" {
				return false
			}
			if c, ok := n.(*ast.CallExpr); ok {
				switch fn := c.Fun.(type) {
				case *ast.Ident:
					name = fn.Name
				case *ast.SelectorExpr:
					name = fn.Sel.Name
				}
			}
			return name == ""
		})
	}
	return name
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// checked is what one doc names that is wrong, and its config examples.
type checked struct {
	problems   []string
	configs    []string // the config examples
	configKeys map[string]bool
}

var (
	fence       = regexp.MustCompile("^\\s*(```+|~~~+)\\s*(\\S*)")
	codeSpan    = regexp.MustCompile("`([^`]+)`")
	link        = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	heading     = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	goQualName  = regexp.MustCompile(`^([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?$`)
	dotted      = regexp.MustCompile(`^[a-z][A-Za-z]*(\.(<[a-z-]+>|[A-Za-z][\w-]*))+$`)
	commandWord = regexp.MustCompile(`^(-{0,2}[a-z][a-z-]*)(\|[a-z][a-z-]*)*[,.:]?$`)
	pathToken   = regexp.MustCompile(`^[\w.@+-]+(/[\w.@+-]+)*/?$`)
)

// sourceExts are the extensions of files a doc names by their name
// alone (`agentdir.go`): such a name must end some file's path.
var sourceExts = []string{".go", ".mjs", ".md", ".sh", ".py", ".yaml", ".ts", ".tsx"}

// check reports every name in one doc that does not exist.
func (ix *docIndex) check(doc, text string) checked {
	r := checked{configKeys: map[string]bool{}}
	bad := func(format string, args ...any) {
		r.problems = append(r.problems, doc+": "+fmt.Sprintf(format, args...))
	}
	var prose []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			prose = append(prose, lines[i])
			continue
		}
		// A fenced block: each line is code.
		var block []string
		j := i + 1
		for ; j < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[j]), m[1]); j++ {
			block = append(block, lines[j])
		}
		isConfig := m[2] == "json" && i > 0 && strings.TrimSpace(lines[i-1]) == configMarker
		if isConfig {
			r.configs = append(r.configs, strings.Join(block, "\n"))
			ix.checkConfig(r.configs[len(r.configs)-1], r.configKeys, bad)
		} else {
			for _, l := range block {
				ix.checkCode(l, false, bad)
			}
		}
		prose = append(prose, "") // a block ends a paragraph
		i = j
	}
	anchors := anchorsOf(strings.Join(prose, "\n"))
	// Inline code may run over a line break: paragraph by paragraph.
	for _, para := range strings.Split(strings.Join(prose, "\n"), "\n\n") {
		para = strings.ReplaceAll(para, "\n", " ")
		for _, m := range codeSpan.FindAllStringSubmatch(para, -1) {
			ix.checkCode(m[1], true, bad)
		}
		for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(para, ""), -1) {
			ix.checkLink(doc, m[1], anchors, bad)
		}
	}
	return r
}

// checkCode checks one code span or one line of a code block.
func (ix *docIndex) checkCode(s string, span bool, bad func(string, ...any)) {
	if i := strings.Index(s, " #"); i >= 0 && !span {
		s = s[:i] // a shell comment
	}
	if strings.HasPrefix(strings.TrimSpace(s), "#") && !span {
		return
	}
	fields := strings.Fields(s)
	for i, f := range fields {
		switch {
		case i > 0 && strings.HasPrefix(fields[i-1], "-"):
			// A flag's value (kubectl -n airlock), not a command.
		case f == "airlock" || strings.HasSuffix(f, "bin/airlock"):
			ix.checkAirlock(fields[i+1:], bad)
		case f == "make":
			for _, arg := range fields[i+1:] {
				if endOfCommand(arg) {
					break
				}
				if strings.HasPrefix(arg, "-") || strings.Contains(arg, "=") {
					continue
				}
				if !ix.targets[arg] {
					bad("`make %s`: the Makefile has no such make target", arg)
				}
			}
		}
	}
	// A span of flags alone (`--pool-size`) names airlock's.
	if span && len(fields) > 0 && isFlag(fields[0]) {
		for _, f := range fields {
			if isFlag(f) && !ix.flags[flagName(f)] {
				bad("`%s`: no airlock command has the flag --%s", s, flagName(f))
			}
		}
	}
	for _, tok := range strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || strings.ContainsRune(",;()[]\"'`=|", r)
	}) {
		tok = strings.TrimRight(tok, ".:")
		ix.checkName(tok, span, bad)
	}
}

// checkName checks a token that may be a path, a test, a Go name or a
// dotted config key.
func (ix *docIndex) checkName(tok string, span bool, bad func(string, ...any)) {
	if tok == "" || strings.ContainsAny(tok, "{}*…$~") || strings.Contains(tok, "://") {
		return
	}
	if span && testFunc.MatchString(tok) {
		if !ix.tests[tok] {
			bad("`%s`: no test, fuzzer or benchmark of that name", tok)
		}
		return
	}
	if m := goQualName.FindStringSubmatch(tok); span && m != nil && ix.decls[m[1]] != nil {
		name := m[2]
		if m[3] != "" {
			name += "." + m[3]
		}
		if !ix.decls[m[1]][name] {
			bad("`%s`: package %s declares no %s", tok, m[1], name)
		}
		return
	}
	if span && dotted.MatchString(tok) && ix.checkDotted(tok, bad) {
		return
	}
	if strings.ContainsAny(tok, "<>") || !pathToken.MatchString(tok) {
		return
	}
	first, _, hasSlash := strings.Cut(tok, "/")
	switch {
	case hasSlash && ix.topDirs[first]:
		if _, err := os.Stat(filepath.Join(ix.root, filepath.FromSlash(tok))); err != nil {
			bad("`%s`: no such file or directory in the repository", tok)
		}
	case !strings.HasPrefix(tok, "/") && slices.Contains(sourceExts, path.Ext(tok)) && (span || hasSlash):
		for _, f := range ix.files {
			if f == tok || strings.HasSuffix(f, "/"+tok) {
				return
			}
		}
		bad("`%s`: no file of the repository has that name", tok)
	}
}

// checkDotted checks builds.x and templates.<name>.x against the
// config's schema, and says whether tok was such a name. network.x is
// not checked: E2B's create request has a network object of its own
// (network.allowOut), which is not config.
func (ix *docIndex) checkDotted(tok string, bad func(string, ...any)) bool {
	parts := strings.Split(tok, ".")
	top, ok := jsonField(ix.config, parts[0])
	if !ok || parts[0] == "network" {
		return false
	}
	if k := deref(top.Type).Kind(); k != reflect.Struct && k != reflect.Map {
		return false
	}
	if !configPath(ix.config, parts) {
		bad("`%s`: the config file has no such key", tok)
	}
	return true
}

// configPath: a path of keys exists in the config's schema (map keys
// are any name).
func configPath(typ reflect.Type, parts []string) bool {
	for _, p := range parts {
		typ = deref(typ)
		switch typ.Kind() {
		case reflect.Map:
			typ = typ.Elem()
		case reflect.Struct:
			f, ok := jsonField(typ, p)
			if !ok {
				return false
			}
			typ = f.Type
		default:
			return false
		}
	}
	return true
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

func jsonField(typ reflect.Type, name string) (reflect.StructField, bool) {
	typ = deref(typ)
	if typ.Kind() != reflect.Struct {
		return reflect.StructField{}, false
	}
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == name && tag != "" && tag != "-" {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// configKeys lists every key of the config's schema, dotted, with
// templates' names as <name>.
func configKeys(typ reflect.Type, prefix string) []string {
	var keys []string
	typ = deref(typ)
	switch typ.Kind() {
	case reflect.Map:
		return configKeys(typ.Elem(), prefix+"<name>.")
	case reflect.Struct:
		for i := range typ.NumField() {
			tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			keys = append(keys, prefix+tag)
			keys = append(keys, configKeys(typ.Field(i).Type, prefix+tag+".")...)
		}
	}
	return keys
}

// checkConfig checks a config example: valid JSON, every key in the
// schema. It records the keys it saw, map keys as <name>.
func (ix *docIndex) checkConfig(text string, seen map[string]bool, bad func(string, ...any)) {
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		bad("config example is not valid JSON: %v", err)
		return
	}
	// Its values must read as the daemon reads them (sizes, durations);
	// unknown keys are reported below, key by key.
	cfg := config.Default()
	if err := json.Unmarshal([]byte(text), &cfg); err != nil {
		bad("config example: %v", err)
	}
	var walk func(v any, typ reflect.Type, prefix, schema string)
	walk = func(v any, typ reflect.Type, prefix, schema string) {
		obj, ok := v.(map[string]any)
		if !ok {
			return
		}
		typ = deref(typ)
		for k, val := range obj {
			switch typ.Kind() {
			case reflect.Map:
				walk(val, typ.Elem(), prefix+k+".", schema+"<name>.")
			case reflect.Struct:
				f, ok := jsonField(typ, k)
				if !ok {
					bad("config example: %s%s is not a key of the config file (internal/config)", prefix, k)
					continue
				}
				seen[schema+k] = true
				walk(val, f.Type, prefix+k+".", schema+k+".")
			default:
				bad("config example: %s holds an object, the config file a value", strings.TrimSuffix(prefix, "."))
				return
			}
		}
	}
	walk(v, ix.config, "", "")
}

// checkAirlock checks the command and flags of an airlock command line
// (the words after airlock).
func (ix *docIndex) checkAirlock(args []string, bad func(string, ...any)) {
	if len(args) == 0 || endOfCommand(args[0]) || !commandWord.MatchString(args[0]) {
		return // airlock named, not run: "embedded in airlock (…)"
	}
	var cmds []*command
	for _, name := range strings.Split(strings.Trim(args[0], "[],.:"), "|") {
		c := ix.commands[name]
		if c == nil {
			bad("`airlock %s`: airlock has no such command", name)
			return
		}
		cmds = append(cmds, c)
	}
	rest := args[1:]
	if len(cmds) == 1 && len(cmds[0].subs) > 0 && len(rest) > 0 && !isFlag(rest[0]) && !endOfCommand(rest[0]) {
		for _, sub := range strings.Split(strings.Trim(rest[0], "[],.:"), "|") {
			if !cmds[0].subs[sub] {
				bad("`airlock %s %s`: no such command", args[0], sub)
			}
		}
		rest = rest[1:]
	}
	for _, a := range rest {
		if endOfCommand(a) {
			return
		}
		a = strings.Trim(a, "[](),")
		if !isFlag(a) {
			continue
		}
		for i, c := range cmds {
			if !c.flags[flagName(a)] {
				bad("`airlock %s`: no flag --%s", strings.Split(args[0], "|")[i], flagName(a))
			}
		}
	}
}

// endOfCommand: a word after which a command line's flags end: its
// arguments (--), a pipe, a list or a redirection.
func endOfCommand(w string) bool {
	switch w {
	case "--", "|", "||", "&&", ";", ">", "2>", ">>", "<", "&":
		return true
	}
	return strings.HasPrefix(w, "#") || strings.HasSuffix(w, ";")
}

func isFlag(w string) bool {
	w = strings.Trim(w, "[](),")
	name := strings.TrimLeft(w, "-")
	return len(name) > 0 && len(w)-len(name) <= 2 && len(w) > len(name) && unicode.IsLetter(rune(name[0]))
}

func flagName(w string) string {
	w = strings.TrimLeft(strings.Trim(w, "[](),"), "-")
	name, _, _ := strings.Cut(w, "=")
	return name
}

// checkLink checks a markdown link: a file of the repository (never
// outside it), and its anchor a heading there.
func (ix *docIndex) checkLink(doc, target string, anchors map[string]bool, bad func(string, ...any)) {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return
	}
	file, anchor, _ := strings.Cut(target, "#")
	if file == "" {
		if !anchors[anchor] {
			bad("link %s: no heading of this doc has that anchor", target)
		}
		return
	}
	rel := path.Join(path.Dir(doc), file)
	if rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(file) {
		bad("link %s leads outside the repository", target)
		return
	}
	b, err := os.ReadFile(filepath.Join(ix.root, filepath.FromSlash(rel)))
	if err != nil {
		if st, serr := os.Stat(filepath.Join(ix.root, filepath.FromSlash(rel))); serr == nil && st.IsDir() {
			return
		}
		bad("link %s: no such file (%s)", target, rel)
		return
	}
	if anchor != "" && strings.HasSuffix(rel, ".md") && !anchorsOf(stripFences(string(b)))[anchor] {
		bad("link %s: %s has no heading with the anchor #%s", target, rel, anchor)
	}
}

// stripFences removes fenced code blocks, whose # lines are no headings.
func stripFences(text string) string {
	var out []string
	var in string
	for _, l := range strings.Split(text, "\n") {
		if m := fence.FindStringSubmatch(l); m != nil && (in == "" || strings.HasPrefix(strings.TrimSpace(l), in)) {
			if in == "" {
				in = m[1]
			} else {
				in = ""
			}
			continue
		}
		if in == "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// anchorsOf returns the anchors GitHub gives a doc's headings: lower
// case, punctuation dropped, spaces as hyphens, repeats numbered.
func anchorsOf(text string) map[string]bool {
	anchors := map[string]bool{}
	count := map[string]int{}
	for _, l := range strings.Split(text, "\n") {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[2]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := count[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		count[a]++
	}
	return anchors
}
