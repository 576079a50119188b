package build

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// newBuilder is a Builder over a fresh store holding the template "base"
// (an image without layers: unpacking one keeps its owners, which needs
// root), whose boxes are fakeBoxes that export layer.
func newBuilder(t *testing.T, layer map[string]string) (*Builder, *fakeHost) {
	t.Helper()
	store, err := image.Open(t.TempDir(), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(512, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(t.Context(), "base", "random", img); err != nil {
		t.Fatal(err)
	}
	files, err := OpenFiles(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	host := &fakeHost{agent: &fakeAgent{}, layer: layer}
	return &Builder{Store: store, Files: files, Host: host, Policy: policy.Default(), ReadyTimeout: time.Minute}, host
}

func logTo(lines *[]string) Logger {
	return func(level, msg string) { *lines = append(*lines, level+": "+msg) }
}

// TestBuild: a build runs its steps in one box started as root with its
// root exported, records the layer the box made on top of the base under
// every name, with the configuration the steps left, starts the start
// command and waits for the ready one; the same build again reuses it.
func TestBuild(t *testing.T) {
	b, host := newBuilder(t, map[string]string{"etc/built": "yes"})
	hash := upload(t, b.Files, "app.py", "print(1)")
	req := &Request{FromTemplate: "base:default", StartCmd: "serve", ReadyCmd: "check", Steps: []Step{
		{Type: "ENV", Args: []string{"MODE", "prod"}},
		{Type: "RUN", Args: []string{"pip install x", "root"}},
		{Type: "COPY", Args: []string{"app.py", "/srv/"}, FilesHash: hash},
		{Type: "WORKDIR", Args: []string{"/srv"}},
	}}
	var logs []string
	res, err := b.Build(t.Context(), []string{"app", "app:v1"}, req, image.Resources{CPUs: 2}, logTo(&logs))
	if err != nil {
		t.Fatalf("build: %v\n%s", err, strings.Join(logs, "\n"))
	}
	if res.Cached || res.Image.Name != "app" || len(host.boxes) != 1 || !host.boxes[0].closed {
		t.Errorf("result %+v, %d boxes (closed: %v)", res, len(host.boxes), host.boxes[0].closed)
	}
	if !host.policy.Root || !host.policy.ExportRoot {
		t.Errorf("the build's box was started with Root %v, ExportRoot %v", host.policy.Root, host.policy.ExportRoot)
	}
	var cmds []string
	for _, c := range host.agent.take() {
		cmds = append(cmds, c.user+" "+c.cmd+c.dir)
	}
	if want := []string{"root /bin/sh -c pip install x", " /", " /srv", "user /bin/sh -c serve", "user /bin/sh -c check"}; !slices.Equal(cmds, want) {
		t.Errorf("the agent was asked %q, want %q", cmds, want)
	}
	base, _ := b.Store.Get("base")
	for _, name := range []string{"app", "app:v1"} {
		img, err := b.Store.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		want := image.Config{Env: []string{"MODE=prod"}, WorkingDir: "/srv", User: "user", StartCmd: "serve", ReadyCmd: "check"}
		if !reflect.DeepEqual(img.Config, want) || img.Resources.CPUs != 2 || len(img.Layers) != len(base.Layers)+1 {
			t.Errorf("%s: config %+v, resources %+v, %d layers", name, img.Config, img.Resources, len(img.Layers))
		}
		dirs, err := b.Store.LayerDirs(img)
		if err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(dirs[len(dirs)-1], "etc/built")); err != nil || string(data) != "yes" {
			t.Errorf("%s's layer: %q %v", name, data, err)
		}
	}

	// Again: reused, with no box started.
	logs = nil
	res, err = b.Build(t.Context(), []string{"again"}, req, image.Resources{}, logTo(&logs))
	if err != nil || !res.Cached || res.Image.Name != "again" || len(host.boxes) != 1 {
		t.Errorf("the same build again: %+v %v, %d boxes", res, err, len(host.boxes))
	}
	if !slices.ContainsFunc(logs, func(l string) bool {
		return strings.HasPrefix(l, "info: the same base and steps were built before: reusing app")
	}) {
		t.Errorf("the log of a reused build: %q", logs)
	}
	// Forced: built anew.
	req.Force = true
	if res, err := b.Build(t.Context(), []string{"forced"}, req, image.Resources{}, logTo(&logs)); err != nil || res.Cached || len(host.boxes) != 2 {
		t.Errorf("a forced build: %+v %v, %d boxes", res, err, len(host.boxes))
	}
}

// TestBuildFails: a failure names its step; the host's own failures say
// so without their cause, which can name host paths.
func TestBuildFails(t *testing.T) {
	b, host := newBuilder(t, nil)
	host.agent.exit = func(cmd string) (int, string) {
		if cmd == "false" {
			return 1, ""
		}
		return 0, ""
	}
	for _, tc := range []struct {
		req  Request
		step string
		msg  string
	}{
		{Request{FromTemplate: "nope"}, "base", `template "nope" is not a template made from an image here`},
		{Request{FromTemplate: "base", Steps: []Step{{Type: "HEALTHCHECK"}}}, "base", `step 1: step type "HEALTHCHECK" is not supported (RUN, COPY, ENV, WORKDIR, USER)`},
		{Request{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"true"}}, {Type: "RUN", Args: []string{"false"}}}}, "2", "the command exited with code 1: false"},
	} {
		_, err := b.Build(t.Context(), []string{"x"}, &tc.req, image.Resources{}, func(string, string) {})
		var se *StepError
		if !errors.As(err, &se) || se.Step != tc.step || err.Error() != tc.msg {
			t.Errorf("%+v: %v, want step %s: %q", tc.req, err, tc.step, tc.msg)
		}
	}
	// A ready command that never succeeds ends the build at its timeout.
	b.ReadyTimeout = 300 * time.Millisecond
	_, err := b.Build(t.Context(), []string{"x"}, &Request{FromTemplate: "base", StartCmd: "serve", ReadyCmd: "false"}, image.Resources{}, func(string, string) {})
	var se *StepError
	if !errors.As(err, &se) || se.Step != "finalize" || err.Error() != "the ready command did not succeed within 300ms: false" {
		t.Errorf("a ready command that fails: %v", err)
	}
	host.err = errors.New("mkdir /var/lib/airlock/boxes/x: permission denied")
	_, err = b.Build(t.Context(), []string{"x"}, &Request{FromTemplate: "base", Force: true}, image.Resources{}, func(string, string) {})
	var ie *InternalError
	if !errors.As(err, &ie) || err.Error() != "the build sandbox could not be started (the server log has the details)" || !errors.Is(err, host.err) {
		t.Errorf("a box that did not start: %v", err)
	}
	if _, err := b.Store.Get("x"); err == nil {
		t.Error("a failed build recorded its name")
	}
}

// TestService: a requested build runs once started, its status and log
// say how it went, and a failure says at which step.
func TestService(t *testing.T) {
	b, host := newBuilder(t, nil)
	host.agent.exit = func(cmd string) (int, string) {
		if cmd == "false" {
			return 2, "oops\n"
		}
		return 0, "fine\n"
	}
	s := &Service{Builder: b, Log: slog.New(slog.DiscardHandler), Timeout: time.Minute, Parallel: 1}
	defer s.Shutdown()
	ok, err := s.Request("app", []string{"default", "v2"}, image.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get("app", ok.BuildID); err != nil || got != ok {
		t.Errorf("Get: %v %v", got, err)
	}
	for _, tc := range [][2]string{{"other", ok.BuildID}, {"app", "nope"}} {
		if _, err := s.Get(tc[0], tc[1]); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%s, %s): %v", tc[0], tc[1], err)
		}
	}
	if st := ok.Status(0); st.Status != "waiting" || len(st.Logs) != 0 {
		t.Errorf("before its start: %+v", st)
	}
	req := &Request{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"true"}}}}
	if err := s.Start(ok, req); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ok, req); !errors.Is(err, ErrConflict) {
		t.Errorf("a second start: %v", err)
	}
	s.wg.Wait()
	st := ok.Status(0)
	if st.Status != "ready" || st.Reason != nil || !slices.ContainsFunc(st.Logs, func(l string) bool { return strings.HasSuffix(l, " fine") }) {
		t.Errorf("a good build: %+v", st)
	}
	if _, err := b.Store.Get("app:v2"); err != nil {
		t.Errorf("the tag v2: %v", err)
	}
	if rest := ok.Status(len(st.LogEntries) - 1); len(rest.LogEntries) != 1 || !strings.HasPrefix(rest.LogEntries[0].Message, "template app is ready") {
		t.Errorf("the log from an offset: %+v", rest.LogEntries)
	}

	bad, _ := s.Request("bad", []string{"default"}, image.Resources{})
	if err := s.Start(bad, &Request{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"false"}}}}); err != nil {
		t.Fatal(err)
	}
	s.wg.Wait()
	if st := bad.Status(0); st.Status != "error" || st.Reason == nil || st.Reason.Step != "1" || st.Reason.Message != "the command exited with code 2: false" {
		t.Errorf("a failing build: %+v %+v", st, st.Reason)
	}
	if err := s.Start(bad, &Request{}); err == nil || !strings.Contains(err.Error(), "exactly one of fromImage and fromTemplate") {
		t.Errorf("a bad request: %v", err)
	}
	if _, err := s.Request(strings.Repeat("a", 125), []string{"longtag"}, image.Resources{}); err == nil {
		t.Error("a name over 128 characters was accepted")
	}
}

// TestBuildLogBounded: a build's log keeps at most maxLog lines, says
// where it was cut, and keeps the error that ends the build.
func TestBuildLogBounded(t *testing.T) {
	b := &Build{}
	for range maxLog + 10 {
		b.log("info", "line")
	}
	b.fail(&StepError{"3", errors.New("it broke")})
	st := b.Status(0)
	if n := len(st.LogEntries); n != maxLog+2 {
		t.Fatalf("%d entries, want %d", n, maxLog+2)
	}
	if cut := st.LogEntries[maxLog]; cut.Level != "warn" || !strings.HasPrefix(cut.Message, "the log is cut here") {
		t.Errorf("the cut: %+v", cut)
	}
	if last := st.LogEntries[maxLog+1]; last.Level != "error" || last.Message != "it broke" || st.Reason.Step != "3" {
		t.Errorf("the end: %+v %+v", last, st.Reason)
	}
	b.log("progress", "pulling")
	if got := b.Status(maxLog + 2); len(got.LogEntries) != 0 {
		t.Errorf("past the cut: %+v", got.LogEntries)
	}
}
