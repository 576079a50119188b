package build

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// FuzzParseDockerfile: any Dockerfile is parsed without a panic, into a
// request of one base and of steps of the kinds a build runs, with the
// arguments each kind takes; an exec-form command becomes a shell
// command of exactly its words.
func FuzzParseDockerfile(f *testing.F) {
	for _, s := range []string{
		"FROM python:3.12\nRUN pip install numpy \\\n  pandas\nCOPY --chown=user --chmod=755 a b /app/\nENV A=1 B=\"two words\"\n" +
			"ARG V=3\nARG NOVALUE\nWORKDIR /app\nUSER user\nCMD [\"python\", \"-c\", \"print('hi')\"]\nLABEL x=y\nEXPOSE 80\n",
		"FROM template:base\nENTRYPOINT [\"sh\", \"-c\", \"echo $0 'a''b'\"]\n", "FROM a\nFROM b\n", "RUN x\nFROM a\n", "FROM\n",
		"FROM a AS b\n", "FROM a\nRUN --mount=type=cache x\n", "FROM a\nCOPY http://x/y /z\n", "FROM a\nCOPY --from=b x y\n",
		"FROM a\nENV\n", "FROM a\nENV K V W\n", "FROM a\nENV 'K=V\n", "FROM a\nCMD [\"unterminated\"\n", "FROM a\nCMD []\n",
		"FROM a\nHEALTHCHECK x\n", "# only a comment\n", "", "FROM a\r\nRUN x\r\n", "FROM a\nRUN x \\", "FROM a\nWORKDIR\n",
		"FROM a\nUSER\n", "from a\nrun x\n", "FROM a\nRUN \x00\n", "FROM ключ\nRUN echo 😀\n", "FROM a\n" + strings.Repeat("RUN x\n", 2000),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		req, _, err := ParseDockerfile(text)
		if err != nil {
			return
		}
		if (req.FromImage == "") == (req.FromTemplate == "") {
			t.Fatalf("%q: base %q, template %q: want exactly one", text, req.FromImage, req.FromTemplate)
		}
		if len(req.Steps) < 3 || req.Steps[0].Type != "USER" || req.Steps[0].Args[0] != "root" || req.Steps[1].Type != "WORKDIR" ||
			req.Steps[len(req.Steps)-1].Type != "USER" {
			t.Fatalf("%q: steps %+v: want root's from the top, and a user at the end", text, req.Steps)
		}
		for _, s := range req.Steps {
			n := len(s.Args)
			ok := false
			switch s.Type {
			case "RUN":
				ok = n == 1 && s.Args[0] != ""
			case "COPY":
				ok = n == 4 && s.Args[0] != "" && s.Args[1] != "" && !strings.Contains(s.Args[0], "://")
			case "ENV":
				ok = n > 0 && n%2 == 0
			case "WORKDIR":
				ok = n == 1 && s.Args[0] != ""
			case "USER":
				ok = n == 1
			}
			if !ok {
				t.Errorf("%q: step %+v", text, s)
			}
		}
	})
}

// FuzzShellForm: an exec-form command (a JSON array of words) becomes a
// /bin/sh command whose words, read back as sh reads single quotes, are
// exactly those.
func FuzzShellForm(f *testing.F) {
	for _, words := range []string{"python\x00-c\x00print('hi')", "sh\x00-c\x00echo $HOME `id` \"$(id)\"", "'\x00''\x00\\'", "", "a b\x00\n\x00ключ😀"} {
		f.Add(words)
	}
	f.Fuzz(func(t *testing.T, joined string) {
		argv := strings.Split(joined, "\x00")
		data, err := json.Marshal(argv)
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := shellForm(string(data))
		if err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		var want []string
		json.Unmarshal(data, &want) // json's view of the words (invalid UTF-8 replaced)
		if got, ok := readSingleQuoted(cmd); !ok || !slices.Equal(got, want) {
			t.Errorf("%s became %q, which sh reads as %q (%v)", data, cmd, got, ok)
		}
	})
}

// readSingleQuoted splits cmd into words as sh does, for what
// shellForm writes: single-quoted strings, backslash escapes and the
// spaces between words. Anything else, which sh would read in its own
// ways (expansions, other quotes), is not ok.
func readSingleQuoted(cmd string) (words []string, ok bool) {
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(cmd); i++ {
		switch c := cmd[i]; {
		case c == '\'':
			j := strings.IndexByte(cmd[i+1:], '\'')
			if j < 0 {
				return nil, false
			}
			cur.WriteString(cmd[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '\\' && i+1 < len(cmd):
			cur.WriteByte(cmd[i+1])
			i++
			inWord = true
		case c == ' ':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			return nil, false
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, true
}
