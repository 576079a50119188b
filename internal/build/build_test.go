package build

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseDockerfile(t *testing.T) {
	req, notes, err := ParseDockerfile(`# comment
FROM python:3.12-slim
ARG V=2
ENV A=1 B="two words"
ENV C three
RUN apt-get update && \
    apt-get install -y git
COPY --chown=user --chmod=0755 a.sh b.sh /opt/
WORKDIR /app
EXPOSE 8000
USER user
CMD ["python3", "-m", "http.server"]
`)
	if err != nil {
		t.Fatal(err)
	}
	if req.FromImage != "python:3.12-slim" || req.StartCmd != "'python3' '-m' 'http.server'" {
		t.Errorf("from %q, start %q", req.FromImage, req.StartCmd)
	}
	var got []string
	for _, s := range req.Steps {
		got = append(got, s.Type+" "+strings.Join(s.Args, "|"))
	}
	want := []string{"USER root", "WORKDIR /", "ENV V|2", "ENV A|1|B|two words", "ENV C|three",
		"RUN apt-get update &&     apt-get install -y git", "COPY a.sh|/opt/|user|0755", "COPY b.sh|/opt/|user|0755",
		"WORKDIR /app", "USER user"}
	if !slices.Equal(got, want) {
		t.Errorf("steps:\n%q\nwant\n%q", got, want)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "EXPOSE") {
		t.Errorf("notes %q", notes)
	}
	for _, c := range []struct{ in, want string }{
		{"", "no FROM"},
		{"RUN x", "first instruction must be FROM"},
		{"FROM a\nFROM b", "multi-stage"},
		{"FROM a AS b", "FROM takes one image"},
		{"FROM a\nVOLUME /x", "line 2: VOLUME is not supported"},
		{"FROM a\nADD https://x/y /z", "of a URL"},
		{"FROM a\nRUN --mount=type=cache true", "no --mount"},
		{"FROM a\nCOPY --from=b x y", "--from is not supported"},
	} {
		if _, _, err := ParseDockerfile(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.in, err, c.want)
		}
	}
	if req, _, _ := ParseDockerfile("FROM template:base-py\n"); req.FromTemplate != "base-py" || req.Steps[len(req.Steps)-1].Args[0] != "user" {
		t.Errorf("FROM template: %+v", req)
	}
}

func TestCheck(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	ok := &Request{FromImage: "x", Steps: []Step{{Type: "RUN", Args: []string{"true", "root"}}, {Type: "COPY", Args: []string{"a", "/b", "user", "644"}, FilesHash: hash},
		{Type: "ENV", Args: []string{"K", "v"}}, {Type: "WORKDIR", Args: []string{"/w"}}, {Type: "USER", Args: []string{"user"}}}}
	if err := ok.Check(); err != nil {
		t.Errorf("a good request: %v", err)
	}
	for _, c := range []struct {
		req  Request
		want string
	}{
		{Request{}, "exactly one of fromImage and fromTemplate"},
		{Request{FromImage: "x", FromTemplate: "y"}, "exactly one"},
		{Request{FromImage: "x", Registry: &Registry{Type: "aws"}}, `type "aws" is not supported`},
		{Request{FromImage: "x", Steps: []Step{{Type: "HEALTHCHECK"}}}, `step 1: step type "HEALTHCHECK"`},
		{Request{FromImage: "x", Steps: []Step{{Type: "RUN", Args: []string{"true", "no body"}}}}, `user "no body" is not a user name`},
		{Request{FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"a", "/b"}}}}, "filesHash"},
		{Request{FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"a", "/b", "", "9z"}, FilesHash: hash}}}, "octal"},
		{Request{FromImage: "x", Steps: []Step{{Type: "ENV", Args: []string{"K"}}}}, "in pairs"},
		{Request{FromImage: "x", Steps: []Step{{Type: "ENV", Args: []string{"A=B", "v"}}}}, "not a variable name"},
	} {
		if err := c.req.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.req, err, c.want)
		}
	}
}

// Where COPY puts each entry of an upload, as Docker's COPY would.
func TestCopyTarget(t *testing.T) {
	for _, c := range []struct {
		name, src   string
		glob, isDir bool
		intoDir     bool
		want        string
		copied      bool
	}{
		{"app", "app", false, true, false, ".", true},
		{"app/main.py", "app", false, false, false, "main.py", true},
		{"app/lib/x.py", "app", false, false, true, "lib/x.py", true},
		{"apple", "app", false, false, false, "", false},
		{"notes.txt", "notes.txt", false, false, false, ".", true},
		{"notes.txt", "notes.txt", false, false, true, "notes.txt", true},
		{"a.py", "*.py", true, false, true, "a.py", true},
		{"src/a.py", "src/*.py", true, false, true, "a.py", true},
		{"other/a.py", "src/*.py", true, false, true, "", false},
	} {
		got, ok := copyTarget(c.name, c.src, c.glob, c.isDir, c.intoDir)
		if got != c.want || ok != c.copied {
			t.Errorf("%s of COPY %s: %q %v, want %q %v", c.name, c.src, got, ok, c.want, c.copied)
		}
	}
}

func TestParseName(t *testing.T) {
	if id, tags, err := ParseName("app:v1", []string{"prod", "v1"}); err != nil || id != "app" || !slices.Equal(tags, []string{"prod", "v1"}) {
		t.Errorf("app:v1: %q %q %v", id, tags, err)
	}
	if _, tags, _ := ParseName("app", nil); !slices.Equal(tags, []string{"default"}) {
		t.Errorf("no tag: %q", tags)
	}
	for _, n := range []string{"", "App", "../x", "a/b", "a:b:c", "a:" + strings.Repeat("x", 70)} {
		if _, _, err := ParseName(n, nil); err == nil {
			t.Errorf("%q was accepted", n)
		}
	}
	if StoreName("app", "default") != "app" || StoreName("app", "v1") != "app:v1" || Normalize("app:default") != "app" {
		t.Error("store names")
	}
}

func TestUploadToken(t *testing.T) {
	s := &Service{}
	exp := time.Now().Add(time.Minute)
	tok := s.UploadToken("app", "h", exp)
	if !s.CheckUpload("app", "h", tok, exp.Unix()) {
		t.Error("a good token was refused")
	}
	flipped := tok[:len(tok)-1] + map[bool]string{true: "1", false: "0"}[tok[len(tok)-1] == '0']
	for _, c := range [][3]string{{"other", "h", tok}, {"app", "h2", tok}, {"app", "h", flipped}} {
		if s.CheckUpload(c[0], c[1], c[2], exp.Unix()) {
			t.Errorf("%v was accepted", c)
		}
	}
	past := time.Now().Add(-time.Second)
	if s.CheckUpload("app", "h", s.UploadToken("app", "h", past), past.Unix()) {
		t.Error("an expired token was accepted")
	}
}

// TestLineLog: output is logged a line at a time, a line longer than
// 4 KiB in pieces of 4 KiB, and not a byte of it lost.
func TestLineLog(t *testing.T) {
	var got []string
	l := &lineLog{log: func(_, msg string) { got = append(got, msg) }}
	l.write([]byte("a\nb"))
	l.write([]byte("c\n\n"))
	long := strings.Repeat("0123456789", 500)
	l.write([]byte(long))
	l.write([]byte("\n" + long + "\nend"))
	l.flush()
	want := []string{"a", "bc", "", long[:4096], long[4096:], long[:4096], long[4096:], "end"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("lines of %v bytes, want %v", lens(got), lens(want))
	}
}

func lens(lines []string) []int {
	var n []int
	for _, l := range lines {
		n = append(n, len(l))
	}
	return n
}
