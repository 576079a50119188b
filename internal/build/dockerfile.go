package build

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ParseDockerfile reads the subset of a Dockerfile that a template build
// runs: one FROM (an image, or a template of the store as
// "FROM template:NAME"), RUN, COPY and ADD of local files (--chown,
// --chmod), ENV, ARG (its default becomes an environment variable, as
// E2B's parser does), WORKDIR, USER, and CMD or ENTRYPOINT as the start
// command. LABEL and EXPOSE describe an image and change nothing of it;
// they are accepted and returned as notes. Anything else is refused,
// naming the line: a build must not look as if it did what it did not.
//
// Steps run as root from the top of the file, like Docker's; the user of
// the last USER (or "user", without one) is the template's.
func ParseDockerfile(text string) (req *Request, notes []string, err error) {
	req = &Request{}
	sawUser := false
	for _, ln := range logicalLines(text) {
		kw, rest, _ := strings.Cut(strings.TrimSpace(ln.text), " ")
		rest = strings.TrimSpace(rest)
		fail := func(format string, args ...any) error {
			return fmt.Errorf("Dockerfile line %d: %s", ln.n, fmt.Sprintf(format, args...))
		}
		switch kw = strings.ToUpper(kw); kw {
		case "FROM":
			if req.FromImage != "" || req.FromTemplate != "" {
				return nil, nil, fail("a second FROM: multi-stage builds are not supported")
			}
			f := strings.Fields(rest)
			if len(f) != 1 {
				return nil, nil, fail("FROM takes one image (no --platform, no AS)")
			}
			if t, ok := strings.CutPrefix(f[0], "template:"); ok {
				req.FromTemplate = t
			} else {
				req.FromImage = f[0]
			}
			if len(req.Steps) > 0 {
				return nil, nil, fail("FROM must come first")
			}
			req.Steps = append(req.Steps, Step{Type: "USER", Args: []string{"root"}}, Step{Type: "WORKDIR", Args: []string{"/"}})
		case "RUN":
			cmd, err := shellForm(rest)
			if err != nil || cmd == "" || strings.HasPrefix(rest, "--") {
				return nil, nil, fail("RUN takes a command (no --mount or other flags)")
			}
			req.Steps = append(req.Steps, Step{Type: "RUN", Args: []string{cmd}})
		case "COPY", "ADD":
			var user, mode string
			f := strings.Fields(rest)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				k, v, _ := strings.Cut(f[0][2:], "=")
				switch k {
				case "chown":
					user = v
				case "chmod":
					mode = v
				default:
					return nil, nil, fail("%s --%s is not supported (--chown, --chmod)", kw, k)
				}
				f = f[1:]
			}
			if len(f) < 2 {
				return nil, nil, fail("%s takes sources and a destination", kw)
			}
			for _, src := range f[:len(f)-1] {
				if strings.Contains(src, "://") {
					return nil, nil, fail("%s of a URL is not supported: download it in a RUN step", kw)
				}
				req.Steps = append(req.Steps, Step{Type: "COPY", Args: []string{src, f[len(f)-1], user, mode}})
			}
		case "ENV", "ARG":
			kv, err := envPairs(rest, kw == "ARG")
			if err != nil {
				return nil, nil, fail("%v", err)
			}
			if len(kv) > 0 {
				req.Steps = append(req.Steps, Step{Type: "ENV", Args: kv})
			}
		case "WORKDIR":
			if rest == "" {
				return nil, nil, fail("WORKDIR takes a directory")
			}
			req.Steps = append(req.Steps, Step{Type: "WORKDIR", Args: []string{rest}})
		case "USER":
			req.Steps = append(req.Steps, Step{Type: "USER", Args: []string{rest}})
			sawUser = true
		case "CMD", "ENTRYPOINT":
			cmd, err := shellForm(rest)
			if err != nil || cmd == "" {
				return nil, nil, fail("%s takes a command", kw)
			}
			req.StartCmd = cmd
		case "LABEL", "EXPOSE":
			notes = append(notes, fmt.Sprintf("line %d: %s describes the image and changes nothing of the template", ln.n, kw))
		default:
			return nil, nil, fail("%s is not supported (FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, CMD, ENTRYPOINT, LABEL, EXPOSE)", kw)
		}
		if req.FromImage == "" && req.FromTemplate == "" {
			return nil, nil, fail("the first instruction must be FROM")
		}
	}
	if req.FromImage == "" && req.FromTemplate == "" {
		return nil, nil, fmt.Errorf("the Dockerfile has no FROM")
	}
	if !sawUser {
		req.Steps = append(req.Steps, Step{Type: "USER", Args: []string{"user"}})
	}
	return req, notes, nil
}

type line struct {
	n    int // of its first physical line
	text string
}

// logicalLines joins continued lines (a trailing backslash) and drops
// comments and blank lines.
func logicalLines(text string) []line {
	var out []line
	var cur strings.Builder
	start := 0
	for i, l := range strings.Split(text, "\n") {
		l = strings.TrimRight(l, "\r")
		t := strings.TrimSpace(l)
		if cur.Len() == 0 && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		} else if strings.HasPrefix(t, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s)
			continue
		}
		cur.WriteString(l)
		out = append(out, line{start, cur.String()})
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, line{start, cur.String()})
	}
	return out
}

// shellForm is the command of a RUN or CMD: the shell form as it is, the
// exec form (a JSON array) quoted for /bin/sh.
func shellForm(s string) (string, error) {
	if !strings.HasPrefix(s, "[") {
		return s, nil
	}
	var argv []string
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		return "", err
	}
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " "), nil
}

// envPairs reads "K=V K2=V2" or "K V" (ENV), or "K[=V]" (ARG: without a
// value there is nothing to set).
func envPairs(s string, arg bool) ([]string, error) {
	if s == "" {
		return nil, fmt.Errorf("ENV and ARG take a name")
	}
	if k, v, ok := strings.Cut(s, " "); ok && !strings.Contains(k, "=") && !arg {
		return []string{k, strings.TrimSpace(unquote(v))}, nil
	}
	var kv []string
	for _, f := range words(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			if arg {
				continue
			}
			return nil, fmt.Errorf("ENV %q: use NAME=VALUE", f)
		}
		kv = append(kv, k, v)
	}
	return kv, nil
}

// words splits s at spaces outside quotes, and drops the quotes.
func words(s string) []string {
	var out []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote == 0 && (r == '"' || r == '\''):
			quote, inWord = r, true
		case quote == 0 && (r == ' ' || r == '\t'):
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

func unquote(v string) string {
	if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
		return v[1 : len(v)-1]
	}
	return v
}
