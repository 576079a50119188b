package nettest

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// The lab's package servers, at http://packages.test: what a sandbox
// installs from "the internet" in the tests of apt, pip and npm.
const (
	// AptRepo is a flat apt repository ("deb [trusted=yes] URL ./") of
	// one package, AptPackage, whose command prints AptOutput.
	AptRepo    = "http://packages.test/debian"
	AptPackage = "airlock-hello"
	AptOutput  = "hello from a deb"
	// PipIndex is a PEP 503 simple index of one wheel, PipPackage, whose
	// module PipModule has greet() returning PipOutput.
	PipIndex   = "http://packages.test/simple/"
	PipPackage = "airlock-greet"
	PipModule  = "airlock_greet"
	PipOutput  = "hello from a wheel"
	// NPMRegistry answers one package, NPMPackage, whose greet() returns
	// NPMOutput.
	NPMRegistry = "http://packages.test/npm/"
	NPMPackage  = "airlock-greet-js"
	NPMOutput   = "hello from npm"
)

// packages serves the apt repository, the simple index and the npm
// registry, made in dir: a .deb built with dpkg-deb, a wheel and an npm
// tarball built here.
func packages(dir string) (http.Handler, error) {
	deb, err := buildDeb(dir)
	if err != nil {
		return nil, err
	}
	whl, err := buildWheel()
	if err != nil {
		return nil, err
	}
	tgz, err := buildNPM()
	if err != nil {
		return nil, err
	}
	debName := AptPackage + "_1.0_all.deb"
	whlName := PipModule + "-1.0-py3-none-any.whl"
	tgzName := NPMPackage + "-1.0.0.tgz"
	files := map[string][]byte{}
	// apt: Packages of the one .deb, and a Release listing it.
	control := fmt.Sprintf("Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: Airlock tests <tests@airlock.invalid>\nDescription: a package of the lab\n"+
		"Filename: ./%s\nSize: %d\nSHA256: %s\n\n", AptPackage, debName, len(deb), sha256hex(deb))
	files["/debian/"+debName] = deb
	files["/debian/Packages"] = []byte(control)
	files["/debian/Release"] = []byte(fmt.Sprintf("Origin: airlock-lab\nLabel: airlock-lab\nDate: %s\nSHA256:\n %s %d Packages\n",
		time.Now().UTC().Format(time.RFC1123), sha256hex([]byte(control)), len(control)))
	// pip: PEP 503, the file's hash in its link.
	files["/simple/"] = []byte(fmt.Sprintf("<!DOCTYPE html><html><body><a href=\"%s/\">%s</a></body></html>\n", PipPackage, PipPackage))
	files["/simple/"+PipPackage+"/"] = []byte(fmt.Sprintf("<!DOCTYPE html><html><body><a href=\"../../files/%s#sha256=%s\">%s</a></body></html>\n",
		whlName, sha256hex(whl), whlName))
	files["/files/"+whlName] = whl
	// npm: the package's document (the fields npm reads) and its tarball.
	sum512 := sha512.Sum512(tgz)
	sum1 := sha1.Sum(tgz)
	doc, _ := json.Marshal(map[string]any{
		"name": NPMPackage, "dist-tags": map[string]string{"latest": "1.0.0"},
		"versions": map[string]any{"1.0.0": map[string]any{
			"name": NPMPackage, "version": "1.0.0", "main": "index.js",
			"dist": map[string]string{"tarball": NPMRegistry + NPMPackage + "/-/" + tgzName,
				"shasum": hex.EncodeToString(sum1[:]), "integrity": "sha512-" + base64.StdEncoding.EncodeToString(sum512[:])},
		}},
	})
	files["/npm/"+NPMPackage] = doc
	files["/npm/"+NPMPackage+"/-/"+tgzName] = tgz
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// apt asks a flat repository ("deb URL ./") for URL/./Packages.
		name := path.Clean(r.URL.Path)
		if strings.HasSuffix(r.URL.Path, "/") && name != "/" {
			name += "/"
		}
		data, ok := files[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if filepath.Ext(name) == "" && strings.HasSuffix(name, "/") {
			w.Header().Set("Content-Type", "text/html")
		}
		w.Write(data)
	}), nil
}

// buildDeb makes the apt package with dpkg-deb: one script in /usr/bin.
func buildDeb(dir string) ([]byte, error) {
	root := filepath.Join(dir, "deb")
	for _, d := range []string{"DEBIAN", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "DEBIAN/control"), []byte(fmt.Sprintf(
		"Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: Airlock tests <tests@airlock.invalid>\nDescription: a package of the lab\n", AptPackage)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin", AptPackage), []byte("#!/bin/sh\necho '"+AptOutput+"'\n"), 0o755); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, AptPackage+".deb")
	if msg, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", root, out).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dpkg-deb: %v: %s", err, msg)
	}
	defer os.RemoveAll(root)
	return os.ReadFile(out)
}

// buildWheel makes the wheel: one pure-Python module.
func buildWheel() ([]byte, error) {
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	info := PipModule + "-1.0.dist-info/"
	for _, f := range []struct{ name, body string }{
		{PipModule + "/__init__.py", "def greet():\n    return " + fmt.Sprintf("%q", PipOutput) + "\n"},
		{info + "METADATA", "Metadata-Version: 2.1\nName: " + PipPackage + "\nVersion: 1.0\n"},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: airlock-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{info + "RECORD", ""},
	} {
		w, err := z.Create(f.name)
		if err != nil {
			return nil, err
		}
		w.Write([]byte(f.body))
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// buildNPM makes the npm package's tarball: package/ with its
// package.json and index.js.
func buildNPM() ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, body string }{
		{"package/package.json", fmt.Sprintf(`{"name": %q, "version": "1.0.0", "main": "index.js"}`, NPMPackage)},
		{"package/index.js", fmt.Sprintf("exports.greet = () => %q\n", NPMOutput)},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		tw.Write([]byte(f.body))
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
