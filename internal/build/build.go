// Package build makes templates: it starts a sandbox from a base image,
// runs a template's steps inside it (commands, file copies, environment,
// working directory, user), reads back what they changed as one new
// image layer and records the result in the image store. It speaks the
// step language of E2B's Template builder (TemplateBuildStartV2), which
// `airlock template build` also produces from a Dockerfile.
//
// Nothing of a build runs on the host: every step runs in the sandbox,
// as root or user of the sandbox's own user namespace, and what the
// sandbox made comes back through the same unpacking, checks and limits
// as any image's layer.
package build

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Request is a template build, as E2B's TemplateBuildStartV2 has it.
type Request struct {
	FromImage    string    `json:"fromImage,omitempty"`
	FromTemplate string    `json:"fromTemplate,omitempty"`
	Registry     *Registry `json:"fromImageRegistry,omitempty"`
	Steps        []Step    `json:"steps,omitempty"`
	StartCmd     string    `json:"startCmd,omitempty"`
	ReadyCmd     string    `json:"readyCmd,omitempty"`
	// Force: build even if an image of the same base and steps exists.
	Force bool `json:"force,omitempty"`
}

// Registry is the credentials of FromImage's registry.
type Registry struct {
	Type     string `json:"type"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Step is one instruction: RUN [cmd, user?], COPY [src, dest, user,
// mode] with the upload of FilesHash, ENV [k1, v1, k2, v2…], WORKDIR
// [dir], USER [name].
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args,omitempty"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// Check refuses a request that cannot be built, naming what is wrong,
// before anything starts.
func (r *Request) Check() error {
	switch {
	case (r.FromImage == "") == (r.FromTemplate == ""):
		return errors.New("give exactly one of fromImage and fromTemplate")
	case r.Registry != nil && r.Registry.Type != "registry":
		return fmt.Errorf("fromImageRegistry.type %q is not supported: only \"registry\" (a user name and password)", r.Registry.Type)
	case r.Registry != nil && r.FromImage == "":
		return errors.New("fromImageRegistry is for fromImage")
	case len(r.Steps) > 1000:
		return fmt.Errorf("%d steps: at most 1000", len(r.Steps))
	}
	for i, s := range r.Steps {
		if err := s.check(); err != nil {
			return fmt.Errorf("step %d: %w", i+1, err)
		}
	}
	return nil
}

func (s *Step) check() error {
	n := len(s.Args)
	switch s.Type {
	case "RUN":
		if n < 1 || n > 2 || s.Args[0] == "" {
			return errors.New("RUN takes a command and an optional user")
		}
		if n == 2 {
			return checkUser(s.Args[1])
		}
	case "COPY":
		if n < 2 || n > 4 || s.Args[0] == "" || s.Args[1] == "" {
			return errors.New("COPY takes a source, a destination, a user and a mode")
		}
		if !validHash(s.FilesHash) {
			return errors.New("COPY needs the filesHash of its upload")
		}
		if n > 2 && s.Args[2] != "" {
			if _, _, err := owner(s.Args[2], ""); err != nil {
				return err
			}
		}
		if n > 3 && s.Args[3] != "" {
			if _, err := strconv.ParseUint(s.Args[3], 8, 12); err != nil {
				return fmt.Errorf("COPY mode %q is not an octal mode", s.Args[3])
			}
		}
	case "ENV":
		if n == 0 || n%2 != 0 {
			return errors.New("ENV takes names and values, in pairs")
		}
		for i := 0; i < n; i += 2 {
			if err := policy.CheckEnv(s.Args[i] + "=" + s.Args[i+1]); err != nil || strings.Contains(s.Args[i], "=") {
				return fmt.Errorf("ENV %q: not a variable name", s.Args[i])
			}
		}
	case "WORKDIR":
		if n != 1 || s.Args[0] == "" {
			return errors.New("WORKDIR takes a directory")
		}
	case "USER":
		if n != 1 {
			return errors.New("USER takes a user")
		}
		return checkUser(s.Args[0])
	default:
		return fmt.Errorf("step type %q is not supported (RUN, COPY, ENV, WORKDIR, USER)", s.Type)
	}
	return nil
}

// A sandbox has two users: its root and "user" (uid 1000), as E2B's
// templates do.
func checkUser(u string) error {
	if u != "root" && u != layout.User {
		return fmt.Errorf("user %q: a sandbox has the users root and %s", u, layout.User)
	}
	return nil
}

func validHash(h string) bool {
	_, err := hex.DecodeString(h)
	return err == nil && len(h) == 64
}

// Auth is the registry credentials of r, nil for none.
func (r *Request) Auth() authn.Authenticator {
	if r.Registry == nil {
		return nil
	}
	return authn.FromConfig(authn.AuthConfig{Username: r.Registry.Username, Password: r.Registry.Password})
}

// Box is a sandbox started for a build.
type Box interface {
	Agent() *agentproto.Client
	// ExportRoot writes what the box changed of its root as a layer.
	ExportRoot(ctx context.Context, w io.Writer) error
	Close()
}

// Host starts the sandboxes of builds.
type Host interface {
	StartBox(ctx context.Context, p policy.Policy) (Box, error)
}

// Builder builds templates into an image store.
type Builder struct {
	Store *image.Store
	Files *Files
	Host  Host
	// Policy is that of build sandboxes (limits, network), to which the
	// base image is added.
	Policy policy.Policy
	// ReadyTimeout bounds how long a start command may take to be ready.
	ReadyTimeout time.Duration
	// Registries carries the pulls of fromImage (a PullRule's Transport
	// for a server's clients); nil: the host's network, as the operator's
	// own airlock template pull. Without credentials in the request, pulls go
	// without any: never with the operator's.
	Registries http.RoundTripper
	// OperatorAuth: a pull without credentials may use the operator's
	// ($DOCKER_CONFIG), as airlock template build does.
	OperatorAuth bool
}

// StepError is a build that failed at one step: "base" (the image or
// template it starts from), "1"… (its steps), or "finalize".
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// InternalError is a failure of the host's, not of the build: its
// message is for the build's client, its cause (which can name host
// paths) for the server's log.
type InternalError struct {
	Msg   string
	Cause error
}

func (e *InternalError) Error() string { return e.Msg + " (the server log has the details)" }
func (e *InternalError) Unwrap() error { return e.Cause }

func internal(msg string, cause error) error { return &InternalError{msg, cause} }

// Logger receives a build's log lines.
type Logger func(level, msg string)

// Result is what a build made.
type Result struct {
	Image  *image.Image
	Cached bool // an image of the same base and steps was reused
}

// Build runs req and records the image it makes under every name of
// names (the first is its own), with the resources res for its sandboxes.
func (b *Builder) Build(ctx context.Context, names []string, req *Request, res image.Resources, log Logger) (*Result, error) {
	if err := req.Check(); err != nil {
		return nil, &StepError{"base", err}
	}
	// The base's layers and the new one are in the store before the
	// template's record: no prune may take them meanwhile.
	release, err := b.Store.Hold()
	if err != nil {
		return nil, err
	}
	defer release()
	base, err := b.base(ctx, req, log)
	if err != nil {
		return nil, &StepError{"base", err}
	}
	key := buildKey(base, req)
	if !req.Force && !slices.ContainsFunc(req.Steps, func(s Step) bool { return s.Force }) {
		if img := b.cached(key); img != nil {
			log("info", "the same base and steps were built before: reusing "+img.Name)
			rec := *img
			rec.Resources = res
			return &Result{Image: &rec, Cached: true}, b.save(&rec, names)
		}
	}
	p := b.Policy
	if err := b.Store.Apply(base, &p, false); err != nil {
		return nil, &StepError{"base", err}
	}
	p.Root, p.ExportRoot = true, true
	log("info", "starting the build sandbox")
	box, err := b.Host.StartBox(ctx, p)
	if err != nil {
		return nil, &StepError{"base", internal("the build sandbox could not be started", err)}
	}
	defer box.Close()
	st := &state{box: box, env: slices.Clone(base.Config.Env), user: layout.User, workdir: layout.Home, files: b.Files, log: log}
	if u := base.Config.User; u == "root" || u == layout.User {
		st.user = u
	}
	if d := base.Config.WorkingDir; path.IsAbs(d) {
		st.workdir = d
	}
	for i, s := range req.Steps {
		log("info", fmt.Sprintf("[%d/%d] %s %s", i+1, len(req.Steps), s.Type, strings.Join(s.Args, " ")))
		if err := st.step(ctx, &s); err != nil {
			return nil, &StepError{strconv.Itoa(i + 1), err}
		}
	}
	log("info", "saving the template's layer")
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(box.ExportRoot(ctx, pw)) }()
	// The end of the build (its timeout, a shutdown) ends both sides.
	stop := context.AfterFunc(ctx, func() { pr.CloseWithError(ctx.Err()) })
	// A layer cannot hold more than the sandbox's disk did: a larger one
	// is made of sparse files, which would cost the store their size.
	budget := min(b.Store.Limits().ImageBytes-base.Size, p.DiskBytes)
	diffID, size, err := b.Store.AddLayer(pr, budget)
	stop()
	pr.CloseWithError(errors.New("read no further"))
	if err != nil {
		var ue *image.UnpackError
		if errors.As(err, &ue) || ctx.Err() != nil {
			return nil, &StepError{"finalize", fmt.Errorf("the template's layer: %w", err)}
		}
		return nil, &StepError{"finalize", internal("the template's layer could not be saved", err)}
	}
	img := &image.Image{
		Source:    base.Source,
		Digest:    base.Digest,
		Layers:    append(slices.Clip(base.Layers), diffID),
		Size:      base.Size + size,
		Created:   time.Now().UTC(),
		BuildKey:  key,
		Resources: res,
		Config: image.Config{Env: st.env, WorkingDir: st.workdir, User: st.user,
			StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd},
	}
	if req.StartCmd != "" {
		log("info", "starting the start command: "+req.StartCmd)
		if err := Start(ctx, box.Agent(), &img.Config, b.ReadyTimeout, log); err != nil {
			return nil, &StepError{"finalize", err}
		}
	}
	log("info", fmt.Sprintf("built: %d layers, %s", len(img.Layers), policy.FormatSize(img.Size)))
	return &Result{Image: img}, b.save(img, names)
}

// save records img under each name.
func (b *Builder) save(img *image.Image, names []string) error {
	for _, n := range names {
		rec := *img
		rec.Name = n
		if err := b.Store.Save(&rec); err != nil {
			return err
		}
	}
	img.Name = names[0]
	return nil
}

// base is the image req starts from, pulled if it is not in the store.
func (b *Builder) base(ctx context.Context, req *Request, log Logger) (*image.Image, error) {
	if req.FromTemplate != "" {
		img, err := b.Store.Get(Normalize(req.FromTemplate))
		if errors.Is(err, image.ErrNotFound) {
			return nil, fmt.Errorf("template %q is not a template made from an image here", req.FromTemplate)
		}
		return img, err
	}
	log("info", "pulling "+req.FromImage)
	auth := req.Auth()
	if auth == nil && !b.OperatorAuth {
		auth = authn.Anonymous
	}
	ctx = image.WithProgress(ctx, func(layer, layers int, n int64) {
		log("progress", fmt.Sprintf("pulling %s: layer %d of %d, %.1f MB", req.FromImage, layer, layers, float64(n)/1e6))
	})
	img, err := b.Store.Fetch(ctx, req.FromImage, auth, b.Registries)
	var refused *RefusedError
	if errors.As(err, &refused) {
		return nil, refused // one line: the URLs the pull tried add nothing
	}
	if err != nil {
		return nil, err
	}
	log("info", fmt.Sprintf("pulled %s: %d layers, %s", req.FromImage, len(img.Layers), policy.FormatSize(img.Size)))
	return img, nil
}

// cached is the image an earlier build of key made, if the store has one.
func (b *Builder) cached(key string) *image.Image {
	imgs, err := b.Store.List()
	if err != nil {
		return nil
	}
	for _, img := range imgs {
		if img.BuildKey == key {
			if _, err := b.Store.LayerDirs(img); err == nil {
				return img
			}
		}
	}
	return nil
}

// buildKey identifies a build by what its result depends on: the base's
// layers and configuration, the steps (the uploads by their hashes) and
// the start and ready commands.
func buildKey(base *image.Image, req *Request) string {
	data, _ := json.Marshal(struct {
		Layers   []string
		Config   image.Config
		Steps    []Step
		Start    string
		Ready    string
		Registry bool
	}{base.Layers, base.Config, req.Steps, req.StartCmd, req.ReadyCmd, req.Registry != nil})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Normalize maps E2B's "name:default" to the store's "name".
func Normalize(name string) string {
	return strings.TrimSuffix(name, ":default")
}

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
		if i < 0 && len(l.buf) < 4096 {
			return
		}
		if i < 0 {
			i = 4096
		}
		l.log("info", strings.TrimRight(string(l.buf[:i]), "\r"))
		l.buf = l.buf[min(i+1, len(l.buf)):]
	}
}

func (l *lineLog) flush() {
	if len(l.buf) > 0 {
		l.log("info", string(l.buf))
		l.buf = nil
	}
}

// untar sends the tar stream data to the agent, which writes it into dir
// with the owner of user (every entry) and the modes it carries.
func (st *state) untar(ctx context.Context, dir, user string, data io.Reader, onlyNew bool) error {
	uid, gid, err := owner(user, st.user)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(chownTar(pw, data, uid, gid)) }()
	err = st.box.Agent().Untar(ctx, dir, onlyNew, pr)
	pr.Close()
	return err
}

// owner is the uid and gid of user ("root", "user", "uid" or "uid:gid"),
// def's when empty.
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
		return 0, 0, fmt.Errorf("owner %q: root, %s or numeric ids", user, layout.User)
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
