package build

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/image"
)

// Service runs the builds of E2B's build API: a build is requested
// (POST /v3/templates), its files uploaded, started (POST
// /v2/templates/{id}/builds/{buildID}) and watched (…/status) until it is
// ready or failed. Builds live in memory: a restarted daemon forgets
// those under way (and the sandboxes they ran in are cleaned up like any).
type Service struct {
	Builder *Builder
	Log     *slog.Logger
	// Timeout bounds one build; Parallel is how many run at once.
	Timeout  time.Duration
	Parallel int

	once   sync.Once
	key    [32]byte // signs upload URLs
	slots  chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	builds map[string]*Build
}

// Build is one build of a template.
type Build struct {
	TemplateID string
	BuildID    string
	Tags       []string // the tags it will have; "default" for the name alone
	Resources  image.Resources
	Created    time.Time

	mu       sync.Mutex
	status   string // waiting, building, ready, error
	started  bool
	ended    time.Time
	logs     []LogEntry
	logBytes int
	reason   *Reason
}

// LogEntry is a line of a build's log, as E2B's API has it.
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
}

// Reason is why a build failed, and at which step.
type Reason struct {
	Message string `json:"message"`
	Step    string `json:"step,omitempty"`
}

// Status is a build's state, with its log from an offset on.
type Status struct {
	TemplateID string     `json:"templateID"`
	BuildID    string     `json:"buildID"`
	Status     string     `json:"status"`
	LogEntries []LogEntry `json:"logEntries"`
	Logs       []string   `json:"logs"`
	Reason     *Reason    `json:"reason,omitempty"`
}

// A build's log keeps at most maxLog lines and maxLogBytes bytes; a
// build is forgotten keepBuild after it ended (or was requested and never
// started), and at most maxBuilds are known at once.
const (
	maxLog      = 20000
	maxLogBytes = 4 << 20
	keepBuild   = time.Hour
	maxBuilds   = 1000
)

// ErrTooMany: too many builds are known; older ones are forgotten after
// keepBuild.
var ErrTooMany = errors.New("too many builds")

func (s *Service) init() {
	s.once.Do(func() {
		rand.Read(s.key[:])
		s.builds = map[string]*Build{}
		s.slots = make(chan struct{}, max(s.Parallel, 1))
		s.ctx, s.cancel = context.WithCancel(context.Background())
	})
}

// ErrNotFound: no such build or template.
var ErrNotFound = errors.New("not found")

// ErrConflict: the build was started already.
var ErrConflict = errors.New("conflict")

// A tag: what E2B allows, lower-case here as names are.
var validTag = lazyRegexp(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ParseName splits E2B's "name[:tag]" and the request's tags into the
// template's ID and its tags ("default" when none is given).
func ParseName(name string, tags []string) (string, []string, error) {
	id, tag, hasTag := strings.Cut(name, ":")
	if err := image.CheckName(id); err != nil || strings.Contains(id, ":") {
		return "", nil, fmt.Errorf("template name %q: use lower-case letters, digits and . _ - (and :tag)", name)
	}
	var all []string
	if hasTag {
		all = append(all, tag)
	}
	all = append(all, tags...)
	if len(all) == 0 {
		all = []string{"default"}
	}
	for _, t := range all {
		if !validTag().MatchString(t) {
			return "", nil, fmt.Errorf("tag %q: use up to 64 lower-case letters, digits and . _ -", t)
		}
	}
	slices.Sort(all)
	return id, slices.Compact(all), nil
}

// StoreName is the image store's name of a template's tag.
func StoreName(id, tag string) string {
	if tag == "" || tag == "default" {
		return id
	}
	return id + ":" + tag
}

// Request registers a build of the template id with tags.
func (s *Service) Request(id string, tags []string, res image.Resources) (*Build, error) {
	s.init()
	for _, t := range tags {
		if len(StoreName(id, t)) > 128 {
			return nil, fmt.Errorf("template name %s:%s is longer than 128 characters", id, t)
		}
	}
	b := &Build{TemplateID: id, BuildID: newID(), Tags: tags, Resources: res, Created: time.Now(), status: "waiting"}
	s.mu.Lock()
	defer s.mu.Unlock()
	for bid, old := range s.builds {
		if old.forgotten() {
			delete(s.builds, bid)
		}
	}
	if len(s.builds) >= maxBuilds {
		return nil, fmt.Errorf("%w: %d are known; finished ones are forgotten after %s", ErrTooMany, maxBuilds, keepBuild)
	}
	s.builds[b.BuildID] = b
	return b, nil
}

// forgotten reports whether the build ended, or was never started, long
// enough ago to be forgotten.
func (b *Build) forgotten() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !b.started:
		return time.Since(b.Created) > keepBuild
	case !b.ended.IsZero():
		return time.Since(b.ended) > keepBuild
	}
	return false
}

// Get returns the build buildID of template id.
func (s *Service) Get(id, buildID string) (*Build, error) {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.builds[buildID]
	if !ok || b.TemplateID != id {
		return nil, fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, id)
	}
	return b, nil
}

// Start runs the build in the background.
func (s *Service) Start(b *Build, req *Request) error {
	s.init()
	if err := req.Check(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.started {
		b.mu.Unlock()
		return fmt.Errorf("%w: build %s was started already", ErrConflict, b.BuildID)
	}
	b.started = true
	b.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.run(b, req)
	}()
	return nil
}

func (s *Service) run(b *Build, req *Request) {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	case <-s.ctx.Done():
		b.fail(&StepError{"base", errors.New("the server shut down")})
		return
	}
	b.setStatus("building")
	ctx, cancel := context.WithTimeout(s.ctx, s.Timeout)
	defer cancel()
	names := make([]string, len(b.Tags))
	for i, t := range b.Tags {
		names[i] = StoreName(b.TemplateID, t)
	}
	start := time.Now()
	res, err := s.Builder.Build(ctx, names, req, b.Resources, b.log)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = &StepError{"finalize", fmt.Errorf("the build did not finish within %s", s.Timeout)}
		}
		var ie *InternalError
		if errors.As(err, &ie) {
			s.Log.Error("template build failed", "template", b.TemplateID, "build", b.BuildID, "err", ie.Cause)
		} else {
			s.Log.Info("template build failed", "template", b.TemplateID, "build", b.BuildID, "err", err)
		}
		b.fail(err)
		return
	}
	s.Log.Info("template built", "template", b.TemplateID, "build", b.BuildID, "cached", res.Cached,
		"s", time.Since(start).Seconds())
	b.log("info", fmt.Sprintf("template %s is ready (%.1f s)", b.TemplateID, time.Since(start).Seconds()))
	b.setStatus("ready")
}

// Shutdown cancels the builds under way and waits for them to end.
func (s *Service) Shutdown() {
	s.init()
	s.cancel()
	s.wg.Wait()
}

// Status is the build's state, with the log entries from offset on.
func (b *Build) Status(offset int) *Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := &Status{TemplateID: b.TemplateID, BuildID: b.BuildID, Status: b.status, Reason: b.reason,
		LogEntries: []LogEntry{}, Logs: []string{}}
	if offset >= 0 && offset < len(b.logs) {
		st.LogEntries = slices.Clone(b.logs[offset:])
	}
	for _, e := range st.LogEntries {
		st.Logs = append(st.Logs, e.Line())
	}
	return st
}

// Line is the entry as a line of E2B's plain logs (Status.Logs).
func (e LogEntry) Line() string { return e.Timestamp.Format(time.RFC3339) + " " + e.Message }

// Log is the build's whole log, oldest first.
func (b *Build) Log() []LogEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.logs)
}

func (b *Build) log(level, msg string) {
	if level == "progress" {
		level = "debug" // E2B's levels: debug, info, warn, error
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case len(b.logs) < maxLog && b.logBytes+len(msg) <= maxLogBytes:
		b.logs = append(b.logs, LogEntry{time.Now().UTC(), level, msg})
		b.logBytes += len(msg)
	case b.logBytes <= maxLogBytes:
		b.logs = append(b.logs, LogEntry{time.Now().UTC(), "warn", "the log is cut here: " + strconv.Itoa(maxLog) + " lines or 4 MiB at most"})
		b.logBytes = maxLogBytes + 1
	case level == "error":
		b.logs = append(b.logs, LogEntry{time.Now().UTC(), level, msg}) // why it failed, always
	}
}

func (b *Build) setStatus(st string) {
	b.mu.Lock()
	b.status = st
	if st == "ready" || st == "error" {
		b.ended = time.Now()
	}
	b.mu.Unlock()
}

func (b *Build) fail(err error) {
	r := &Reason{Message: err.Error()}
	var se *StepError
	if errors.As(err, &se) {
		r.Step = se.Step
	}
	b.log("error", err.Error())
	b.mu.Lock()
	b.status, b.reason, b.ended = "error", r, time.Now()
	b.mu.Unlock()
}

// UploadToken signs the upload of hash for template id until expires.
func (s *Service) UploadToken(id, hash string, expires time.Time) string {
	s.init()
	m := hmac.New(sha256.New, s.key[:])
	fmt.Fprintf(m, "%s\x00%s\x00%d", id, hash, expires.Unix())
	return hex.EncodeToString(m.Sum(nil))
}

// CheckUpload reports whether token signs the upload of hash for id, and
// has not expired.
func (s *Service) CheckUpload(id, hash, token string, expires int64) bool {
	if time.Now().Unix() > expires {
		return false
	}
	want := s.UploadToken(id, hash, time.Unix(expires, 0))
	return hmac.Equal([]byte(want), []byte(token))
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// lazyRegexp compiles expr at its first use, not at every start of the
// binary: a counted repetition such as {0,127} takes a fraction of a
// millisecond to compile, which airlock run would pay each time.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
