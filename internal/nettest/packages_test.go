package nettest

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
)

// The package servers answer what apt, pip and npm read, with hashes
// that match what they serve.
func TestPackageServers(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb is not installed")
	}
	h, err := packages(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) []byte {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		data, _ := io.ReadAll(resp.Body)
		return data
	}
	// apt: the Packages entry names the .deb by its hash, dpkg reads it;
	// apt asks a flat repository ("deb URL ./") for URL/./Packages.
	pkgs := string(get("/debian/./Packages"))
	deb := get("/debian/./" + AptPackage + "_1.0_all.deb")
	if !strings.Contains(pkgs, "SHA256: "+sha256hex(deb)) {
		t.Errorf("Packages does not name the .deb's hash:\n%s", pkgs)
	}
	if !strings.Contains(string(get("/debian/Release")), sha256hex([]byte(pkgs))) {
		t.Error("Release does not list Packages' hash")
	}
	// pip: the index links the wheel with its hash; the wheel holds the module.
	page := string(get("/simple/" + PipPackage + "/"))
	whl := get("/files/" + PipModule + "-1.0-py3-none-any.whl")
	if !strings.Contains(page, "#sha256="+sha256hex(whl)) {
		t.Errorf("the index page does not link the wheel by its hash:\n%s", page)
	}
	z, err := zip.NewReader(bytes.NewReader(whl), int64(len(whl)))
	if err != nil || len(z.File) == 0 || z.File[0].Name != PipModule+"/__init__.py" {
		t.Errorf("the wheel: %v", err)
	}
	// npm: the document's tarball URL and integrity match the tarball.
	var doc struct {
		Versions map[string]struct {
			Dist struct{ Tarball, Integrity string }
		}
	}
	if err := json.Unmarshal(get("/npm/"+NPMPackage), &doc); err != nil {
		t.Fatal(err)
	}
	dist := doc.Versions["1.0.0"].Dist
	tgz := get(strings.TrimPrefix(dist.Tarball, "http://packages.test"))
	sum := sha512.Sum512(tgz)
	if dist.Integrity != "sha512-"+base64.StdEncoding.EncodeToString(sum[:]) {
		t.Errorf("integrity %s does not match the tarball", dist.Integrity)
	}
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	if strings.Join(names, " ") != "package/package.json package/index.js" {
		t.Errorf("the tarball holds %v", names)
	}
}
