package stock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// sources are the host's apt sources of the Debian archive: what the
// stock root is made from, and what its own apt uses afterwards.
type sources struct {
	suite   string // the release (bookworm), debootstrap's
	mirror  string // the archive's URI for it
	entries []entry
}

type entry struct {
	uris, suites, components []string
}

// debianKeyring is the keyring of Debian's archive, in the root as on the
// host (debian-archive-keyring, which apt depends on).
const debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// readSources reads the apt sources of the host whose root is root:
// /etc/apt/sources.list and sources.list.d's *.list and *.sources. Only
// binary ("deb") entries signed by Debian's archive keyring (or by none
// named, as apt's default) are kept: a third party's repository is the
// host's business, not its sandboxes'.
func readSources(root string) (*sources, error) {
	var all []entry
	etc := filepath.Join(root, "etc/apt")
	if data, err := os.ReadFile(filepath.Join(etc, "sources.list")); err == nil {
		all = append(all, parseList(data)...)
	}
	files, _ := filepath.Glob(filepath.Join(etc, "sources.list.d", "*"))
	slices.Sort(files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		switch filepath.Ext(f) {
		case ".list":
			all = append(all, parseList(data)...)
		case ".sources":
			all = append(all, parseDeb822(data)...)
		}
	}
	s := &sources{entries: all}
	for _, e := range all {
		for _, suite := range e.suites {
			// The release itself, not its -updates or -security.
			if s.suite == "" && !strings.ContainsAny(suite, "-/") && len(e.uris) > 0 {
				s.suite, s.mirror = suite, e.uris[0]
			}
		}
	}
	if s.suite == "" {
		return nil, errors.New("stock root: the host's apt sources (/etc/apt) name no Debian release to make it from")
	}
	return s, nil
}

// parseList reads one-line-style entries: deb [opts] URI SUITE COMP...
func parseList(data []byte) []entry {
	var out []entry
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			var opts []string
			for len(f) > 0 {
				opts = append(opts, f[0])
				done := strings.HasSuffix(f[0], "]")
				f = f[1:]
				if done {
					break
				}
			}
			if !debianSigned(optValue(strings.Trim(strings.Join(opts, " "), "[]"), "signed-by")) {
				continue
			}
		}
		if len(f) < 2 {
			continue
		}
		out = append(out, entry{uris: f[:1], suites: f[1:2], components: f[2:]})
	}
	return out
}

func optValue(opts, key string) string {
	for _, o := range strings.Fields(opts) {
		if k, v, ok := strings.Cut(o, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// parseDeb822 reads deb822-style stanzas (Types:, URIs:, Suites:…).
func parseDeb822(data []byte) []entry {
	var out []entry
	for _, stanza := range strings.Split(strings.ReplaceAll(string(data), "\r", ""), "\n\n") {
		fields := map[string]string{}
		var last string
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if line[0] == ' ' || line[0] == '\t' {
				fields[last] += "\n" + strings.TrimSpace(line) // a continuation (an inline key)
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
		if !slices.Contains(strings.Fields(fields["types"]), "deb") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		if !debianSigned(fields["signed-by"]) {
			continue
		}
		e := entry{uris: strings.Fields(fields["uris"]), suites: strings.Fields(fields["suites"]), components: strings.Fields(fields["components"])}
		if len(e.uris) > 0 && len(e.suites) > 0 {
			out = append(out, e)
		}
	}
	return out
}

// debianSigned: a source signed by Debian's archive keys (the keyring's
// file, or none named: apt's trusted keys, Debian's on a Debian host).
func debianSigned(signedBy string) bool {
	return signedBy == "" || strings.HasPrefix(signedBy, "/usr/share/keyrings/debian-archive-")
}

// deb822 is the root's apt sources: the host's Debian entries.
func (s *sources) deb822() []byte {
	var b strings.Builder
	for i, e := range s.entries {
		if i > 0 {
			b.WriteString("\n")
		}
		comps := e.components
		if len(comps) == 0 {
			comps = []string{"main"}
		}
		fmt.Fprintf(&b, "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\nSigned-By: %s\n",
			strings.Join(e.uris, " "), strings.Join(e.suites, " "), strings.Join(comps, " "), debianKeyring)
	}
	return []byte(b.String())
}
