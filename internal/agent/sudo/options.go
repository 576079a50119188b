package sudo

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
)

// securePath is Debian's sudoers secure_path: the PATH of every command
// sudo runs.
const securePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// keptEnv are the variables env_reset keeps (sudo's defaults, less the
// ones that make no sense in a sandbox).
var keptEnv = []string{"TERM", "COLORTERM", "LANG", "LANGUAGE", "LC_ALL", "DISPLAY", "XAUTHORITY", "TZ"}

type options struct {
	mode         string // "" runs a command; help, version, validate, reset, list
	user         string
	preserveAll  bool
	preserveVars []string
	setHome      bool
	login, shell bool
	dir          string
	assign       []string // VAR=value before the command
	argv         []string
}

// longOptions are sudo's long options, as the short ones they spell.
var longOptions = map[string]byte{
	"--user": 'u', "--chdir": 'D', "--set-home": 'H', "--login": 'i', "--shell": 's',
	"--non-interactive": 'n', "--stdin": 'S', "--help": 'h', "--version": 'V', "--validate": 'v',
	"--reset-timestamp": 'k', "--remove-timestamp": 'K', "--list": 'l',
}

// parse reads sudo's arguments.
func parse(args []string) (*options, error) {
	o := &options{user: "root"}
	i, err := o.parseOptions(args)
	if err != nil {
		return nil, err
	}
	for ; i < len(args) && strings.Contains(args[i], "=") && !strings.HasPrefix(args[i], "="); i++ {
		o.assign = append(o.assign, args[i])
	}
	o.argv = args[i:]
	switch u := o.user; u {
	case "#0":
		o.user = "root"
	case "#1000":
		o.user = identity.User.Name
	}
	if o.mode == "" && len(o.argv) == 0 && !o.login && !o.shell {
		if slices.ContainsFunc(args, func(a string) bool {
			return a == "-k" || a == "-K" || a == "--reset-timestamp" || a == "--remove-timestamp"
		}) {
			o.mode = "validate" // sudo -k alone: nothing to do
			return o, nil
		}
		return nil, errors.New("no command")
	}
	if o.login && o.shell {
		return nil, errors.New("only one of -i and -s")
	}
	return o, nil
}

// parseOptions reads the options at the start of args, and returns the
// index of the first argument that is none.
func (o *options) parseOptions(args []string) (int, error) {
	i := 0
	// value is option name's argument: attached (inline) or the next one.
	value := func(name, inline string) (string, error) {
		if inline != "" {
			return inline, nil
		}
		if i+1 >= len(args) {
			return "", fmt.Errorf("option %s requires an argument", name)
		}
		i++
		return args[i], nil
	}
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return i + 1, nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			return i, nil
		}
		if strings.HasPrefix(a, "--") {
			name, inline, _ := strings.Cut(a, "=")
			if name == "--preserve-env" {
				if inline == "" {
					o.preserveAll = true
				} else {
					o.preserveVars = append(o.preserveVars, strings.Split(inline, ",")...)
				}
				continue
			}
			c, ok := longOptions[name]
			if !ok {
				return 0, fmt.Errorf("option %s is not supported here", name)
			}
			if _, err := o.option(c, name, inline, value); err != nil {
				return 0, err
			}
			continue
		}
		// Short options, possibly grouped (-nE), the last one's value
		// possibly attached (-uroot).
		for j := 1; j < len(a); j++ {
			took, err := o.option(a[j], "-"+a[j:j+1], a[j+1:], value)
			if err != nil {
				return 0, err
			}
			if took {
				break
			}
		}
	}
	return i, nil
}

// option applies the short option c, named name, followed in its
// argument by rest; it reports whether it took rest as its value.
func (o *options) option(c byte, name, rest string, value func(name, inline string) (string, error)) (took bool, err error) {
	switch c {
	case 'u':
		o.user, err = value(name, rest)
		return true, err
	case 'D':
		o.dir, err = value(name, rest)
		return true, err
	case 'E':
		o.preserveAll = true
	case 'H':
		o.setHome = true
	case 'i':
		o.login = true
	case 's':
		o.shell = true
	case 'n', 'S', 'A':
	case 'k', 'K':
		// No password, so no timestamp to forget; -k with a command
		// runs it.
	case 'h':
		o.mode = "help"
	case 'V':
		o.mode = "version"
	case 'v':
		o.mode = "validate"
	case 'l':
		o.mode = "list"
	case 'b':
		return false, errors.New("option -b is not supported here (use the shell's &)")
	default:
		return false, fmt.Errorf("option %s is not supported here", name)
	}
	return false, nil
}

// request builds what the agent runs: the command (in the target's shell
// for -i and -s), its directory and its environment.
func (o *options) request() (*request, error) {
	home, shell, err := passwdEntry(o.user)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	if o.preserveAll {
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	} else {
		for _, k := range append(keptEnv, o.preserveVars...) {
			if v, ok := os.LookupEnv(k); ok {
				env[k] = v
			}
		}
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "LC_") {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	if !o.preserveAll || o.setHome || o.login {
		env["HOME"] = home
	}
	env["PATH"] = securePath
	env["SHELL"] = shell
	env["USER"], env["LOGNAME"] = o.user, o.user
	env["SUDO_USER"] = identity.User.Name
	if os.Getuid() == identity.Root.UID {
		env["SUDO_USER"] = identity.Root.Name
	}
	env["SUDO_UID"], env["SUDO_GID"] = fmt.Sprint(os.Getuid()), fmt.Sprint(os.Getgid())
	env["SUDO_COMMAND"] = strings.Join(o.argv, " ")
	for _, kv := range o.assign {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}

	argv := o.argv
	switch {
	case o.login || o.shell:
		if o.shell && os.Getenv("SHELL") != "" {
			shell = os.Getenv("SHELL")
		}
		argv = []string{shell}
		if o.login {
			argv = append(argv, "-l")
		}
		if len(o.argv) > 0 {
			argv = append(argv, "-c", shellJoin(o.argv))
		}
	}
	dir := o.dir
	if dir != "" && !filepath.IsAbs(dir) {
		if wd, err := os.Getwd(); err == nil {
			dir = filepath.Join(wd, dir)
		}
	}
	if dir == "" && o.login {
		dir = home
	}
	if dir == "" {
		if dir, err = os.Getwd(); err != nil {
			dir = home
		}
	}
	req := &request{User: o.user, Argv: argv, Dir: dir}
	for k, v := range env {
		req.Env = append(req.Env, k+"="+v)
	}
	return req, nil
}

// shellJoin joins a command for -c as sudo does: every character that is
// not a letter, digit, '_', '-' or '$' escaped with a backslash.
func shellJoin(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		for _, r := range a {
			if !(r == '_' || r == '-' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// passwdFile is the sandbox's user database.
var passwdFile = "/etc/passwd"

// passwdEntry is user's home and shell, from the sandbox's passwdFile.
func passwdEntry(user string) (home, shell string, err error) {
	f, err := os.Open(passwdFile)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[0] == user {
			if fields[6] == "" {
				fields[6] = "/bin/sh"
			}
			return fields[5], fields[6], nil
		}
	}
	return "", "", fmt.Errorf("unknown user %s", user)
}
