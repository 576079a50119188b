package main

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/image/imagetest"
)

// importImage writes img as a docker save archive and imports it as
// template name into stateDir.
func importImage(t *testing.T, stateDir, templateName string, img v1.Image) {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "image.tar")
	tag, _ := name.NewTag("test/" + templateName + ":1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	if r := airlock(t, "", "template", "import", templateName, archive, "--state-dir", stateDir); r.code != 0 {
		t.Fatalf("template import: exit %d: %s", r.code, r.stderr)
	}
}

func busybox(t *testing.T, top ...imagetest.Entry) v1.Image {
	t.Helper()
	if _, err := os.Stat(imagetest.Busybox); err != nil {
		t.Skip("no busybox-static (make test installs it)")
	}
	var layers []v1.Layer
	if len(top) > 0 {
		l, err := imagetest.Layer(top...)
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	img, err := imagetest.BusyboxImage([]string{"PATH=/bin", "GREETING=from the image"}, "/srv", layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestRunTemplate(t *testing.T) {
	airlocktest.RequiresRoot(t)
	state := t.TempDir()
	importImage(t, state, "bb", busybox(t,
		imagetest.Entry{Name: "srv/hello", Body: "hello from a layer\n"},
		imagetest.Entry{Name: "etc/.wh.group"}))
	run := func(args ...string) cliResult {
		t.Helper()
		r := airlock(t, "", append([]string{"run", "--state-dir", state, "--template", "bb"}, args...)...)
		airlocktest.CheckNoLeftovers(t, namespaces.DefaultStateDir)
		return r
	}
	r := run("--", "/bin/sh", "-c", `id -u; pwd; echo "$GREETING"; cat /srv/hello; stat -c '%u %A' /bin/busybox /tmp; test -e /usr && echo host-usr; grep -c '^user:' /etc/group; echo written > /tmp/mark; cat /tmp/mark`)
	want := "1000\n/srv\nfrom the image\nhello from a layer\n0 -rwxr-xr-x\n0 drwxrwxrwt\n1\nwritten\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("in the template: exit %d, stdout %q, want %q; stderr %s", r.code, r.stdout, want, r.stderr)
	}
	// Each sandbox starts from the image, not from the last one's writes.
	if r := run("--", "/bin/sh", "-c", "test -e /tmp/mark && echo kept || echo fresh"); r.stdout != "fresh\n" {
		t.Errorf("a write survived its sandbox: %q %s", r.stdout, r.stderr)
	}
	// The disk limit bounds the writable layer.
	r = run("--disk", "2M", "--", "/bin/sh", "-c", "dd if=/dev/zero of=/tmp/big bs=1M count=8 2>&1 | grep -i space")
	if !strings.Contains(r.stdout, "No space left") {
		t.Errorf("8 MB in a 2 MB writable layer: %q %s", r.stdout, r.stderr)
	}
	// Root of the sandbox, which on the host is one of its own ids.
	r = run("--user", "root", "--", "/bin/sh", "-c", "id -u; touch /etc/root-only && echo wrote; cat /proc/self/uid_map")
	if f := strings.Fields(r.stdout); r.code != 0 || len(f) != 5 || f[0] != "0" || f[1] != "wrote" || f[2] != "0" || f[3] < "1073741824" || f[4] != "65536" {
		t.Errorf("--user root: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r := airlock(t, "", "run", "--state-dir", state, "--template", "nope", "--", "/bin/true"); r.code != 2 || !strings.Contains(r.stderr, `no template "nope"`) {
		t.Errorf("an unknown template: exit %d %q", r.code, r.stderr)
	}
}

// An image is untrusted: its symlinks are followed only inside the
// sandbox, never on the host while the sandbox is built.
func TestTemplateSymlinksStayInside(t *testing.T) {
	airlocktest.RequiresRoot(t)
	state := t.TempDir()
	hostDir := t.TempDir()
	os.Chmod(hostDir, 0o777)
	hostFile := filepath.Join(hostDir, "precious")
	os.WriteFile(hostFile, []byte("host data\n"), 0o666)
	importImage(t, state, "links", busybox(t,
		imagetest.Entry{Name: "dev", Type: tar.TypeSymlink, Link: hostDir},
		imagetest.Entry{Name: "home", Type: tar.TypeSymlink, Link: hostDir},
		imagetest.Entry{Name: "etc/hosts", Type: tar.TypeSymlink, Link: hostFile},
		imagetest.Entry{Name: "etc/passwd", Type: tar.TypeSymlink, Link: hostFile},
		imagetest.Entry{Name: "srv/", Type: tar.TypeDir}))
	r := airlock(t, "", "run", "--state-dir", state, "--template", "links", "--", "/bin/sh", "-c", "cat /etc/hosts; ls /dev/null")
	if r.code == 0 && strings.Contains(r.stdout, "host data") {
		t.Errorf("the sandbox read a host file through the image's symlink: %q", r.stdout)
	}
	if entries, _ := os.ReadDir(hostDir); len(entries) != 1 {
		t.Errorf("building the sandbox wrote on the host: %v", entries)
	}
	if data, _ := os.ReadFile(hostFile); string(data) != "host data\n" {
		t.Errorf("the host file changed: %q", data)
	}
	airlocktest.CheckNoLeftovers(t, namespaces.DefaultStateDir)
}

func TestTemplateBadInput(t *testing.T) {
	airlocktest.RequiresRoot(t)
	state := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"template"}, ""},
		{[]string{"template", "frob"}, `unknown template command "frob"`},
		{[]string{"template", "import", "bb"}, "takes 2 argument(s), got 1"},
		{[]string{"template", "import", "Bad Name", "/x"}, "template name"},
		{[]string{"template", "import", "bb", "/nonexistent-airlock-archive"}, "image archive"},
		{[]string{"template", "rm", "nope"}, `no such template "nope"`},
		{[]string{"template", "list", "--state-dir", "relative"}, "not an absolute path"},
		{[]string{"template", "stock", "--cache", "cache"}, `stock cache "cache" is not an absolute path`},
		{[]string{"template", "stock", "extra"}, "template stock takes 0 argument(s), got 1"},
	} {
		args := append(tc.args, "--state-dir", state)
		if len(tc.args) > 1 && tc.args[len(tc.args)-2] == "--state-dir" {
			args = tc.args
		}
		r := airlock(t, "", args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// A template of the image store is a template of airlock serve: E2B's
// Sandbox.create(name).
func TestServeTemplate(t *testing.T) {
	airlocktest.RequiresRoot(t)
	state := t.TempDir()
	s := startServe(t, state, "--pool-size", "0")
	defer s.stop(t)
	importImage(t, state, "bb", busybox(t, imagetest.Entry{Name: "srv/hello", Body: "hello from a layer\n"}))
	code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "bb"}, map[string]string{"X-API-KEY": s.key})
	if code != 201 {
		t.Fatalf("create from the template: %d %s", code, body)
	}
	var c created
	json.Unmarshal(body, &c)
	if out := s.run(t, c, "cat /srv/hello; echo $GREETING; test -e /usr/lib || echo no-host-usr; ls /usr/local/bin"); out != "hello from a layer\nfrom the image\nno-host-usr\nsudo\n" {
		t.Errorf("in a sandbox of the template: %q", out)
	}
	// Root and the user, as E2B's templates have them.
	if out := s.runAs(t, c, "root", "id -u; echo configured > /etc/app.conf; mkdir /opt && chown user /opt && ls -ld /opt | cut -c1-10"); out != "0\ndrwxr-xr-x\n" {
		t.Errorf("as root: %q", out)
	}
	if out := s.runAs(t, c, "user", "id -u; cat /etc/app.conf; touch /etc/nope 2>/dev/null || echo refused; touch /opt/mine && stat -c %u /opt/mine"); out != "1000\nconfigured\nrefused\n1000\n" {
		t.Errorf("as the user: %q", out)
	}
	if code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "nope"}, map[string]string{"X-API-KEY": s.key}); code != 400 || !strings.Contains(string(body), "nope") {
		t.Errorf("an unknown template: %d %s", code, body)
	}
}

// airlock template build: a Dockerfile's steps in a sandbox of its base;
// what the steps made, removed and linked comes back as one layer, and
// nothing the build's code made of its files reaches the host.
func TestTemplateBuild(t *testing.T) {
	airlocktest.RequiresRoot(t)
	state := t.TempDir()
	importImage(t, state, "bb", busybox(t, imagetest.Entry{Name: "srv/old", Body: "old\n"}))
	hostDir := t.TempDir()
	hostFile := filepath.Join(hostDir, "precious")
	os.WriteFile(hostFile, []byte("host data\n"), 0o644)
	ctx := t.TempDir()
	os.MkdirAll(filepath.Join(ctx, "app/sub"), 0o755)
	os.WriteFile(filepath.Join(ctx, "app/run.sh"), []byte("echo run\n"), 0o755)
	os.WriteFile(filepath.Join(ctx, "app/sub/data"), []byte("data\n"), 0o644)
	os.Symlink(hostFile, filepath.Join(ctx, "app/link")) // copied as a link, never followed
	dockerfile := filepath.Join(ctx, "Dockerfile")
	os.WriteFile(dockerfile, []byte(`FROM template:bb
ENV STAGE=built
RUN echo "step output $STAGE" && mkdir -p /opt/made && echo made > /opt/made/file \
    && rm /srv/old && ln -s `+hostFile+` /opt/made/to-host && mkfifo /opt/made/fifo \
    && ln /opt/made/file /opt/made/hard
COPY app /opt/app
COPY --chown=user --chmod=0640 app/sub/data /opt/data
USER user
WORKDIR /opt/work
RUN whoami > /opt/work/who
`), 0o644)
	r := airlock(t, "", "template", "build", "built", "-f", dockerfile, "--state-dir", state, "--net", "none")
	if r.code != 0 || !strings.Contains(r.stderr, "step output built") {
		t.Fatalf("template build: exit %d\n%s", r.code, r.stderr)
	}
	airlocktest.CheckNoLeftovers(t, namespaces.DefaultStateDir)
	r = airlock(t, "", "run", "--state-dir", state, "--template", "built", "--", "/bin/sh", "-c",
		`cat /opt/made/file /opt/app/run.sh /opt/app/sub/data; stat -c '%U %a' /opt/data; cat /opt/work/who; pwd; echo $STAGE;
		 test -e /srv/old || echo removed; readlink /opt/app/link; test -p /opt/made/fifo && echo fifo; stat -c %h /opt/made/hard`)
	want := "made\necho run\ndata\nuser 640\nuser\n/opt/work\nbuilt\nremoved\n" + hostFile + "\nfifo\n2\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("a sandbox of the built template: exit %d\n%q\nwant %q\n%s", r.code, r.stdout, want, r.stderr)
	}
	// The new layer holds the build's symlink as a symlink: the host read
	// nothing through it.
	layers, _ := filepath.Glob(filepath.Join(state, "images", "layers", "*", "opt", "made", "to-host"))
	if len(layers) != 1 {
		t.Fatalf("the build's layer: %v", layers)
	}
	if fi, err := os.Lstat(layers[0]); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the build's symlink came back as %v (%v)", fi, err)
	}
	// The same base and steps again: reused, not rebuilt.
	if r := airlock(t, "", "template", "build", "again", "-f", dockerfile, "--state-dir", state, "--net", "none"); r.code != 0 || !strings.Contains(r.stderr, "reusing built") {
		t.Errorf("a second build of the same steps: exit %d\n%s", r.code, r.stderr)
	}
	// A failing step fails the build and records nothing.
	bad := filepath.Join(ctx, "Dockerfile.bad")
	os.WriteFile(bad, []byte("FROM template:bb\nRUN echo doomed && exit 7\n"), 0o644)
	if r := airlock(t, "", "template", "build", "bad", "-f", bad, "--state-dir", state, "--net", "none"); r.code != 2 || !strings.Contains(r.stderr, "exited with code 7") {
		t.Errorf("a failing step: exit %d\n%s", r.code, r.stderr)
	}
	if r := airlock(t, "", "template", "list", "--state-dir", state); strings.Contains(r.stdout, "bad") {
		t.Errorf("a failed build left a template:\n%s", r.stdout)
	}
	for _, c := range []struct{ dockerfile, want string }{
		{"RUN true\n", "the first instruction must be FROM"},
		{"FROM template:bb\nHEALTHCHECK CMD true\n", "line 2: HEALTHCHECK is not supported"},
		{"FROM template:bb\nFROM template:bb\n", "multi-stage"},
		{"FROM template:bb\nCOPY ../../etc/passwd /x\n", "inside the build context"},
		{"FROM template:bb\nUSER nobody\n", "USER nobody: invalid username: 'nobody'"},
		{"FROM template:bb\nUSER no/body\n", `user "no/body" is not a user name`},
	} {
		os.WriteFile(bad, []byte(c.dockerfile), 0o644)
		if r := airlock(t, "", "template", "build", "bad", "-f", bad, "--state-dir", state, "--net", "none"); r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%q: exit %d %q, want %q", c.dockerfile, r.code, r.stderr, c.want)
		}
	}
	if data, _ := os.ReadFile(hostFile); string(data) != "host data\n" {
		t.Errorf("the host file changed: %q", data)
	}
	airlocktest.CheckNoLeftovers(t, namespaces.DefaultStateDir)
}

// On gVisor a template's root is the host's read-only overlay of its
// layers under gVisor's writable layer: the same root, user, writes and
// disk limit, and nothing mounted on the host afterwards.
func TestRunTemplateGVisor(t *testing.T) {
	airlocktest.RequiresRoot(t)
	if os.Getenv("AIRLOCK_RUNSC") == "" {
		t.Skip("AIRLOCK_RUNSC is not set (make test builds runsc)")
	}
	state := t.TempDir()
	importImage(t, state, "bb", busybox(t,
		imagetest.Entry{Name: "srv/hello", Body: "hello from a layer\n"},
		imagetest.Entry{Name: "etc/.wh.group"}))
	run := func(args ...string) cliResult {
		t.Helper()
		return airlock(t, "", append([]string{"run", "--backend", "gvisor", "--state-dir", state, "--template", "bb"}, args...)...)
	}
	r := run("--", "/bin/sh", "-c", `id -u; whoami; pwd; echo "$GREETING"; cat /srv/hello; test -e /usr && echo host-usr; echo written > /tmp/mark; cat /tmp/mark; touch /etc/x 2>/dev/null || echo no-etc`)
	want := "1000\nuser\n/srv\nfrom the image\nhello from a layer\nwritten\nno-etc\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("in the template: exit %d, stdout %q, want %q; stderr %s", r.code, r.stdout, want, r.stderr)
	}
	if r := run("--", "/bin/sh", "-c", "test -e /tmp/mark && echo kept || echo fresh"); r.stdout != "fresh\n" {
		t.Errorf("a write survived its sandbox: %q %s", r.stdout, r.stderr)
	}
	r = run("--disk", "2M", "--", "/bin/sh", "-c", "for i in 1 2 3 4; do dd if=/dev/zero of=/tmp/big$i bs=1M count=1 2>&1; done | grep -qi 'no space' && echo full")
	if r.stdout != "full\n" {
		t.Errorf("4 MB in a 2 MB writable layer: %q %s", r.stdout, r.stderr)
	}
	if r := run("--user", "root", "--", "/bin/sh", "-c", "id -u; echo conf > /etc/app.conf && cat /etc/app.conf"); r.stdout != "0\nconf\n" {
		t.Errorf("--user root: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if data, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(data), state) {
		t.Errorf("a mount of the template is left on the host:\n%s", data)
	}
}

// The build API refuses what it cannot build, naming it, and pulls a
// client's image from internet addresses only: fromImage must not make
// the daemon reach its host's loopback.
func TestServeBuildRefusals(t *testing.T) {
	airlocktest.RequiresRoot(t)
	state := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "airlock.json")
	os.WriteFile(cfg, []byte(`{"builds": {"network": "none"}}`), 0o644)
	s := startServe(t, state, "--pool-size", "0", "--config", cfg)
	defer s.stop(t)
	key := map[string]string{"X-API-KEY": s.key}
	code, body := s.do(t, "POST", "/v3/templates", map[string]any{"name": "refused", "cpuCount": 1}, key)
	var req struct{ TemplateID, BuildID string }
	if json.Unmarshal(body, &req); code != 202 || req.TemplateID != "refused" || req.BuildID == "" {
		t.Fatalf("request a build: %d %s", code, body)
	}
	build := "/v2/templates/refused/builds/" + req.BuildID
	for _, c := range []struct {
		body any
		want string
	}{
		{map[string]any{"fromImage": "x", "volumes": []string{"/v"}}, "volumes is not supported"},
		{map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "RUN", "args": []string{"true"}, "cache": true}}}, "steps[0].cache"},
		{map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "VOLUME", "args": []string{"/v"}}}}, `step 1: step type "VOLUME"`},
		{map[string]any{"fromImage": "x", "fromTemplate": "y"}, "exactly one of fromImage and fromTemplate"},
		{map[string]any{"fromImage": "x", "fromImageRegistry": map[string]any{"type": "aws"}}, `"aws" is not supported`},
	} {
		code, body := s.do(t, "POST", build, c.body, key)
		var e struct{ Message string }
		if json.Unmarshal(body, &e); code != 400 || !strings.Contains(e.Message, c.want) {
			t.Errorf("%v: %d %s, want 400 naming %s", c.body, code, body, c.want)
		}
	}
	if code, body := s.do(t, "POST", build, map[string]any{"fromImage": "127.0.0.1:1/busybox:latest"}, key); code != 202 {
		t.Fatalf("start the build: %d %s", code, body)
	}
	if code, _ := s.do(t, "POST", build, map[string]any{"fromImage": "127.0.0.1:1/busybox:latest"}, key); code != 409 {
		t.Errorf("a build started twice: %d, want 409", code)
	}
	var st struct {
		Status string
		Reason struct{ Message, Step string }
	}
	for i := 0; i < 300 && st.Status != "error" && st.Status != "ready"; i++ {
		time.Sleep(20 * time.Millisecond)
		_, body := s.do(t, "GET", "/templates/refused/builds/"+req.BuildID+"/status", nil, key)
		json.Unmarshal(body, &st)
	}
	if st.Status != "error" || st.Reason.Step != "base" || !strings.HasPrefix(st.Reason.Message, "registry 127.0.0.1:1 refused: its address 127.0.0.1 is not an internet address") {
		t.Errorf("a build from a loopback registry: %+v", st)
	}
	if code, _ := s.do(t, "GET", "/templates/refused/builds/nope/status", nil, key); code != 404 {
		t.Errorf("the status of an unknown build: %d", code)
	}
	if code, _ := s.do(t, "GET", "/templates/aliases/refused", nil, key); code != 404 {
		t.Errorf("a failed build made a template: %d", code)
	}
	hash := strings.Repeat("ab", 32)
	if code, _ := s.do(t, "PUT", "/templates/refused/files/"+hash+"?expires=9999999999&token=00", "data", nil); code != 403 {
		t.Errorf("an upload with a forged token: %d, want 403", code)
	}
	if code, body := s.do(t, "POST", "/v3/templates", map[string]any{"name": "Bad/Name"}, key); code != 400 || !strings.Contains(string(body), "template name") {
		t.Errorf("a bad name: %d %s", code, body)
	}
	if code, _ := s.do(t, "POST", "/v3/templates", map[string]any{"name": "x"}, nil); code != 401 {
		t.Errorf("a build without the API key: %d", code)
	}
}

// A build's layer is read back through a pipe with the store's budget: a
// RUN step's sparse files, which gVisor serializes at their full size,
// never land on the host first. The state directory is a small tmpfs of
// the test's, whose use is watched throughout the build.
func TestBuildLayerCannotFillTheHostGVisor(t *testing.T) {
	airlocktest.RequiresRoot(t)
	if os.Getenv("AIRLOCK_RUNSC") == "" {
		t.Skip("AIRLOCK_RUNSC is not set (make test builds runsc)")
	}
	state := t.TempDir()
	if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(state, unix.MNT_DETACH) })
	importImage(t, state, "bb", busybox(t))
	cfg := filepath.Join(t.TempDir(), "airlock.json")
	os.WriteFile(cfg, []byte(`{"builds": {"network": "none", "disk": "32M", "memory": "256M"}}`), 0o644)
	used := func() int64 {
		var st unix.Statfs_t
		unix.Statfs(state, &st)
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	s := startServe(t, state, "--backend", "gvisor", "--pool-size", "0", "--config", cfg)
	defer s.stop(t)
	key := map[string]string{"X-API-KEY": s.key}
	code, body := s.do(t, "POST", "/v3/templates", map[string]any{"name": "sparse"}, key)
	var req struct{ BuildID string }
	if json.Unmarshal(body, &req); code != 202 {
		t.Fatalf("request a build: %d %s", code, body)
	}
	// Twelve files of 30 MB each, of nothing: 360 MB serialized.
	steps := []any{map[string]any{"type": "RUN", "args": []string{"for i in 1 2 3 4 5 6 7 8 9 10 11 12; do dd if=/dev/zero of=/home/user/s$i bs=1048576 count=0 seek=30 || exit; done"}}}
	before := used()
	if code, body := s.do(t, "POST", "/v2/templates/sparse/builds/"+req.BuildID, map[string]any{"fromTemplate": "bb", "steps": steps}, key); code != 202 {
		t.Fatalf("start the build: %d %s", code, body)
	}
	var st struct {
		Status string
		Reason struct{ Message, Step string }
	}
	peak := before
	for i := 0; i < 6000 && st.Status != "error" && st.Status != "ready"; i++ {
		time.Sleep(5 * time.Millisecond)
		peak = max(peak, used())
		if i%20 == 0 {
			_, body := s.do(t, "GET", "/templates/sparse/builds/"+req.BuildID+"/status", nil, key)
			json.Unmarshal(body, &st)
		}
	}
	if st.Status != "error" || st.Reason.Step != "finalize" {
		t.Errorf("a layer of 360 MB under a 32 MB budget: %+v", st)
	}
	if grew := peak - before; grew > 64<<20 {
		t.Errorf("the state directory grew by %d MiB during the build", grew>>20)
	}
}
