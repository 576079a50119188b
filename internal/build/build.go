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
	"context"
	"crypto/sha256"
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
			if _, _, err := owner(s.Args[2], ""); err != nil && !errors.Is(err, errUserName) {
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

// A step may run as any user of its image, as on E2B: whether the image
// has them is known when the step runs.
func checkUser(u string) error {
	if !agentproto.ValidUserName(u) {
		return fmt.Errorf("user %q is not a user name", u)
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
	if u := base.Config.User; agentproto.ValidUserName(u) {
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
