package build

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

// state is where a build is between steps.
type state struct {
	box     Box
	env     []string
	user    string
	workdir string
	files   *Files
	log     Logger
}

func (st *state) step(ctx context.Context, s *Step) error {
	switch s.Type {
	case "RUN":
		user := st.user
		if len(s.Args) > 1 && s.Args[1] != "" {
			user = s.Args[1]
		}
		return st.run(ctx, s.Args[0], user)
	case "COPY":
		return st.copy(ctx, s)
	case "ENV":
		for i := 0; i < len(s.Args); i += 2 {
			st.env = layout.MergeEnv(st.env, []string{s.Args[i] + "=" + s.Args[i+1]})
		}
	case "WORKDIR":
		dir := st.abs(s.Args[0])
		// Made for the user of the steps that follow, as E2B does.
		if err := st.untar(ctx, dir, st.user, tarOf(&tar.Header{Name: ".", Typeflag: tar.TypeDir, Mode: 0o755}), true); err != nil {
			return fmt.Errorf("WORKDIR %s: %w", dir, err)
		}
		st.workdir = dir
	case "USER":
		// Any user of the image; one it lacks fails here, not at the
		// first step that runs as them.
		if _, _, err := st.ids(ctx, s.Args[0]); err != nil {
			return fmt.Errorf("USER %s: %w", s.Args[0], err)
		}
		st.user = s.Args[0]
	}
	return nil
}

func (st *state) abs(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(st.workdir, p)
}

// run runs cmd with /bin/sh as user in the working directory; its output
// goes to the build's log.
func (st *state) run(ctx context.Context, cmd, user string) error {
	code, err := Run(ctx, st.box.Agent(), cmd, user, st.workdir, st.env, st.log)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("the command exited with code %d: %s", code, cmd)
	}
	return nil
}

// Run runs cmd with /bin/sh -c as user in dir with env, each line of its
// output logged, and returns its exit code.
func Run(ctx context.Context, c *agentproto.Client, cmd, user, dir string, env []string, log Logger) (int, error) {
	envs := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		envs[k] = v
	}
	stdin := false
	req := agentproto.StartRequest{Process: &agentproto.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}, Envs: envs, Cwd: &dir}, Stdin: &stdin}
	var lines lineLog
	lines.log = log
	code := -1
	for ev, err := range agentproto.Stream[agentproto.StartResponse](ctx, as(c, user), agentproto.StartProcedure, req, 0) {
		if err != nil {
			return -1, err
		}
		switch e := ev.Event; {
		case e == nil:
		case e.Data != nil:
			lines.write(e.Data.Stdout)
			lines.write(e.Data.Stderr)
		case e.End != nil:
			code = int(e.End.ExitCode)
			if !e.End.Exited && code == 0 {
				code = -1 // killed by a signal
			}
		}
	}
	lines.flush()
	return code, nil
}

// as is c acting as user, as envd's clients say it: Basic authorization.
func as(c *agentproto.Client, user string) *agentproto.Client {
	cc := *c
	cc.Header = c.Header.Clone()
	if cc.Header == nil {
		cc.Header = http.Header{}
	}
	cc.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	return &cc
}

// lineLog logs output a line at a time (at most 4 KiB each).
type lineLog struct {
	buf []byte
	log Logger
}

func (l *lineLog) write(p []byte) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 && len(l.buf) < maxLine {
			return
		}
		next := i + 1 // past the newline
		if i < 0 || i > maxLine {
			// A long line goes in pieces, none of it dropped.
			i, next = maxLine, maxLine
		}
		l.log("info", strings.TrimRight(string(l.buf[:i]), "\r"))
		l.buf = l.buf[next:]
	}
}

// maxLine bounds a line of a build's log.
const maxLine = 4096

func (l *lineLog) flush() {
	if len(l.buf) > 0 {
		l.log("info", string(l.buf))
		l.buf = nil
	}
}

// untar sends the tar stream data to the agent, which writes it into dir
// with the owner of user (every entry) and the modes it carries.
func (st *state) untar(ctx context.Context, dir, user string, data io.Reader, onlyNew bool) error {
	uid, gid, err := st.ids(ctx, user)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(chownTar(pw, data, uid, gid)) }()
	err = st.box.Agent().Untar(ctx, dir, onlyNew, pr)
	pr.Close()
	return err
}

// ids are the uid and gid of user (the steps' user when empty): any
// user of the image, as on E2B, looked up in the build sandbox's
// /etc/passwd.
func (st *state) ids(ctx context.Context, user string) (int, int, error) {
	uid, gid, err := owner(user, st.user)
	if !errors.Is(err, errUserName) {
		return uid, gid, err
	}
	if user == "" {
		user = st.user
	}
	resp, err := as(st.box.Agent(), "root").Do(ctx, agentproto.EnvdPort, "GET", "/files?path=/etc/passwd", "", nil)
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: the image's /etc/passwd: %w", user, err)
	}
	defer resp.Body.Close()
	uid, gid, _, err = agentproto.LookupUser(resp.Body, user)
	if errors.Is(err, agentproto.ErrNoUser) {
		// envd's words for a user that does not exist.
		return 0, 0, fmt.Errorf("invalid username: '%s': the image has no such user", user)
	}
	return uid, gid, err
}

// errUserName: a user named, not root, user or numeric ids: the image's
// /etc/passwd says who it is (state.ids).
var errUserName = errors.New("a user name to look up")

// owner is the uid and gid of user ("root", "user", "uid" or "uid:gid"),
// def's when empty; errUserName for any other user name.
func owner(user, def string) (int, int, error) {
	if user == "" {
		user = def
	}
	switch user {
	case "root":
		return 0, 0, nil
	case layout.User:
		return layout.UID, layout.GID, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	uid, err1 := strconv.ParseUint(u, 10, 16)
	gid, err2 := strconv.ParseUint(g, 10, 16)
	if !hasGroup {
		gid, err2 = uid, nil
	}
	if err1 != nil || err2 != nil {
		if !hasGroup && agentproto.ValidUserName(user) {
			return 0, 0, errUserName
		}
		return 0, 0, fmt.Errorf("owner %q: a user name, root, %s or numeric ids", user, layout.User)
	}
	return int(uid), int(gid), nil
}

// chownTar copies the tar stream r to w with every entry owned by
// uid:gid.
func chownTar(w io.Writer, r io.Reader, uid, gid int) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return err
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = uid, gid, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

func tarOf(hdrs ...*tar.Header) io.Reader {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		tw.WriteHeader(h)
	}
	tw.Close()
	return &buf
}
