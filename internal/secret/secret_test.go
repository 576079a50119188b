package secret

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// open opens a store in a directory of its own, not yet made.
func open(t *testing.T) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "secrets")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func reopen(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCreateGetUpdateDelete(t *testing.T) {
	s, dir := open(t)
	info, err := s.Create("GitHub_Token", "ghp_first", map[string]string{"team": "infra"})
	if err != nil {
		t.Fatal(err)
	}
	if !validID(info.ID) || info.Name != "github_token" || info.Version != 1 || info.Metadata["team"] != "infra" ||
		info.Created.IsZero() || !info.Updated.Equal(info.Created) {
		t.Fatalf("Create = %+v", info)
	}
	for _, key := range []string{"github_token", "GITHUB_TOKEN", info.ID, strings.ToUpper(info.ID)} {
		got, err := s.Get(key)
		if err != nil || got.ID != info.ID {
			t.Errorf("Get(%q) = %+v, %v; want %s", key, got, err, info.ID)
		}
	}
	if _, err := s.Create("github_TOKEN", "other", nil); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "github_token") {
		t.Errorf("Create of an existing name: %v, want ErrExists naming it", err)
	}

	// nil metadata keeps the old; an empty map clears it; a map replaces.
	for i, tc := range []struct {
		meta map[string]string
		want map[string]string
	}{
		{nil, map[string]string{"team": "infra"}},
		{map[string]string{"team": "web", "env": "prod"}, map[string]string{"team": "web", "env": "prod"}},
		{map[string]string{}, map[string]string{}},
	} {
		value := fmt.Sprintf("ghp_%d", i+2)
		got, err := s.Update("GitHub_Token", value, tc.meta)
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != int64(i+2) || got.Metadata == nil || !mapsEqual(got.Metadata, tc.want) || got.Updated.Before(got.Created) {
			t.Errorf("Update %d = %+v, want version %d, metadata %v", i, got, i+2, tc.want)
		}
		if v, err := s.Value(info.ID); err != nil || v != value {
			t.Errorf("Value after Update %d = %q, %v; want %q", i, v, err, value)
		}
	}
	if _, err := s.Update("nothing", "x", nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("Update of a missing secret: %v, want ErrNotFound", err)
	}

	// The store's maps are not the caller's.
	got, _ := s.Get(info.ID)
	got.Metadata["injected"] = "yes"
	if again, _ := s.Get(info.ID); len(again.Metadata) != 0 {
		t.Errorf("a caller changed the store's metadata: %v", again.Metadata)
	}

	if err := s.Delete("GITHUB_token"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(info.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
	if _, err := s.Value("github_token"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Value after Delete: %v, want ErrNotFound", err)
	}
	if err := s.Delete(info.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(dir, info.ID+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted secret's file remains: %v", err)
	}
	if _, err := s.Create("github_token", "again", nil); err != nil {
		t.Errorf("Create after Delete: %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestList(t *testing.T) {
	s, _ := open(t)
	var want []string
	for i := range 7 {
		info, err := s.Create(fmt.Sprintf("key%d", i), "value", nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, info.ID)
	}
	var got []string
	var sizes []int
	next := ""
	for {
		page, token, err := s.List(3, next)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page))
		for _, info := range page {
			got = append(got, info.ID)
		}
		if token == "" {
			break
		}
		next = token
	}
	if !slices.Equal(sizes, []int{3, 3, 1}) {
		t.Errorf("page sizes %v, want [3 3 1]", sizes)
	}
	if !slices.Equal(sortedByList(t, s, want), got) {
		t.Errorf("pages hold %v, want %v", got, want)
	}

	// A page follows on after its last secret was deleted.
	first, token, _ := s.List(3, "")
	if err := s.Delete(first[2].ID); err != nil {
		t.Fatal(err)
	}
	second, _, err := s.List(3, token)
	if err != nil || len(second) != 3 || second[0].ID != got[3] {
		t.Errorf("page after a deleted secret = %v, %v; want from %s", second, err, got[3])
	}

	for _, bad := range []string{"x", "!!!", "MTIz"} {
		if _, _, err := s.List(3, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("List with token %q: %v, want ErrInvalid", bad, err)
		}
	}
	if page, token, err := s.List(-1, ""); err != nil || len(page) != 6 || token != "" {
		t.Errorf("List(-1) = %d secrets, token %q, %v; want all 6, no token", len(page), token, err)
	}
}

// sortedByList returns ids in List's order: by creation time, then ID.
func sortedByList(t *testing.T, s *Store, ids []string) []string {
	t.Helper()
	infos := make([]Info, len(ids))
	for i, id := range ids {
		infos[i], _ = s.Get(id)
	}
	slices.SortFunc(infos, func(a, b Info) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := make([]string, len(infos))
	for i, info := range infos {
		out[i] = info.ID
	}
	return out
}

func TestListEmpty(t *testing.T) {
	s, _ := open(t)
	page, token, err := s.List(10, "")
	if err != nil || page == nil || len(page) != 0 || token != "" {
		t.Errorf("List of an empty store = %v, %q, %v; want an empty page", page, token, err)
	}
}

func TestReopen(t *testing.T) {
	s, dir := open(t)
	a, _ := s.Create("a", "value-a", map[string]string{"k": "v"})
	b, _ := s.Create("b", "value-b1", nil)
	b, err := s.Update("b", "value-b2", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := reopen(t, dir)
	for _, want := range []Info{a, b} {
		got, err := r.Get(want.Name)
		if err != nil || got.ID != want.ID || got.Version != want.Version || !mapsEqual(got.Metadata, want.Metadata) ||
			!got.Created.Equal(want.Created) || !got.Updated.Equal(want.Updated) {
			t.Errorf("after reopening, Get(%s) = %+v, %v; want %+v", want.Name, got, err, want)
		}
	}
	for name, want := range map[string]string{"a": "value-a", "B": "value-b2", b.ID: "value-b2"} {
		if got, err := r.Value(name); err != nil || got != want {
			t.Errorf("after reopening, Value(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	page, _, _ := r.List(0, "")
	if len(page) != 2 {
		t.Errorf("after reopening, List has %d secrets, want 2", len(page))
	}
}

func TestNoPlaintextOnDisk(t *testing.T) {
	s, dir := open(t)
	values := []string{"sk-live-0123456789abcdefOLD", "sk-live-0123456789abcdefNEW"}
	if _, err := s.Create("stripe", values[0], nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update("stripe", values[1], nil); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("store holds %d files, want the key and one secret", len(entries))
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if bytes.Contains(b, []byte(v)) || bytes.Contains(b, []byte("0123456789abcdef")) {
				t.Errorf("%s holds a value in plain text", e.Name())
			}
		}
		if fi, _ := e.Info(); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", e.Name(), fi.Mode().Perm())
		}
	}
}

// TestMovedCiphertext: a sealed value copied into another secret's file, or
// into its own at another version, does not open.
func TestMovedCiphertext(t *testing.T) {
	for _, tc := range []struct {
		name string
		move func(t *testing.T, s *Store, dir string) (victim string, leaked []string)
	}{
		{"another secret", func(t *testing.T, s *Store, dir string) (string, []string) {
			a, _ := s.Create("a", "value-of-a", nil)
			b, _ := s.Create("b", "value-of-b", nil)
			rb := readFile(t, dir, b.ID)
			rb.Sealed = readFile(t, dir, a.ID).Sealed
			writeFile(t, dir, rb)
			return "b", []string{"value-of-a", "value-of-b"}
		}},
		{"another version", func(t *testing.T, s *Store, dir string) (string, []string) {
			a, _ := s.Create("a", "version-1", nil)
			v1 := readFile(t, dir, a.ID).Sealed
			if _, err := s.Update("a", "version-2", nil); err != nil {
				t.Fatal(err)
			}
			r := readFile(t, dir, a.ID)
			r.Sealed = v1
			writeFile(t, dir, r)
			return "a", []string{"version-1"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := open(t)
			victim, leaked := tc.move(t, s, dir)
			got, err := reopen(t, dir).Value(victim)
			if err == nil || slices.Contains(leaked, got) {
				t.Fatalf("Value(%s) = %q, %v; want an error", victim, got, err)
			}
			for _, v := range leaked {
				if strings.Contains(err.Error(), v) {
					t.Errorf("error %q shows a value", err)
				}
			}
		})
	}
}

func readFile(t *testing.T, dir, id string) record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func writeFile(t *testing.T, dir string, r record) {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, r.ID+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestNames(t *testing.T) {
	s, _ := open(t)
	for _, tc := range []struct {
		name string
		want string // the error's text, or "" for a name accepted
	}{
		{"OpenAI_Key", ""},
		{"a.b-c_d", ""},
		{"ключ", ""},
		{strings.Repeat("x", 256), ""},
		{"", "secret name is empty"},
		{strings.Repeat("x", 257), "secret name is longer than 256 bytes"},
		{"sec_abc", `secret name "sec_abc" may not begin with "sec_", which is reserved for IDs`},
		{"SEC_abc", `secret name "SEC_abc" may not begin with "sec_", which is reserved for IDs`},
		{"a{b", `secret name "a{b" may not contain '{' or '}'`},
		{"a}b", `secret name "a}b" may not contain '{' or '}'`},
		{"a$b", `secret name "a$b" may not contain '$'`},
		{"a b", `secret name "a b" may not contain whitespace`},
		{"a\tb", `secret name "a\tb" may not contain whitespace`},
		{"a\nb", `secret name "a\nb" may not contain whitespace`},
		{"a\u00a0b", `secret name "a\u00a0b" may not contain whitespace`},
		{"a\x00b", `secret name "a\x00b" may not contain control characters`},
		{"a\x7fb", `secret name "a\x7fb" may not contain control characters`},
		{"a\xffb", `secret name "a\xffb" is not UTF-8`},
	} {
		err := ValidName(tc.name)
		_, cerr := s.Create(tc.name, "v", nil)
		if tc.want == "" {
			if err != nil || cerr != nil {
				t.Errorf("name %q: ValidName %v, Create %v; want it accepted", tc.name, err, cerr)
			}
			continue
		}
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidName(%.40q) = %v, want %q", tc.name, err, tc.want)
		}
		if cerr == nil || cerr.Error() != tc.want {
			t.Errorf("Create(%.40q) = %v, want %q", tc.name, cerr, tc.want)
		}
	}
	if info, err := s.Get("openai_key"); err != nil || info.Name != "openai_key" {
		t.Errorf("Get(openai_key) = %+v, %v; want the name lower-cased", info, err)
	}
	// A lookup beginning with "sec_" is an ID, never a name.
	if _, err := s.Get("sec_abc"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(sec_abc) = %v, want ErrNotFound", err)
	}
}

func TestValues(t *testing.T) {
	s, _ := open(t)
	const ctl = "secret value may not contain a control character but the tab: it is sent in an HTTP header"
	for i, tc := range []struct {
		value string
		want  string
	}{
		{"x", ""},
		{"with\ttab and spaces", ""},
		{strings.Repeat("v", 16<<10), ""},
		{"", "secret value is empty"},
		{strings.Repeat("v", 16<<10+1), "secret value is 16385 bytes, more than 16384"},
		{"hidden\r\nX-Evil: 1", ctl},
		{"hidden\nX-Evil: 1", ctl},
		{"hidden\x00", ctl},
		{"bell\x07", ctl},
	} {
		name := fmt.Sprintf("value%d", i)
		_, err := s.Create(name, tc.value, nil)
		if tc.want == "" {
			if err != nil {
				t.Errorf("value %d: Create: %v", i, err)
			} else if got, err := s.Value(name); err != nil || got != tc.value {
				t.Errorf("value %d: Value = %.20q, %v", i, got, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("value %d: Create: %v, want %q", i, err, tc.want)
		}
		if _, err := s.Update("value0", tc.value, nil); err == nil || err.Error() != tc.want {
			t.Errorf("value %d: Update: %v, want %q", i, err, tc.want)
		}
	}
}

func TestMetadata(t *testing.T) {
	entries := func(n, keyLen, valueLen int) map[string]string {
		m := map[string]string{}
		for i := range n {
			k := fmt.Sprintf("%03d", i)
			m[k+strings.Repeat("k", keyLen-len(k))] = strings.Repeat("v", valueLen)
		}
		return m
	}
	s, _ := open(t)
	if _, err := s.Create("target", "v", nil); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		meta map[string]string
		want string
	}{
		{nil, ""},
		{entries(32, 3, 10), ""},
		{entries(1, 128, 1024), ""},
		{entries(8, 24, 1000), ""}, // 8192 bytes in all
		{entries(33, 3, 1), "secret metadata: at most 32 entries"},
		{map[string]string{"": "v"}, "secret metadata: a key is empty"},
		{entries(1, 129, 1), `secret metadata key "000kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"… is longer than 128 bytes`},
		{map[string]string{"k": strings.Repeat("v", 1025)}, `secret metadata value of "k" is longer than 1024 bytes`},
		{entries(9, 100, 1000), "secret metadata: keys and values total 9900 bytes, more than 8192"},
		{map[string]string{"k": "\xff"}, `secret metadata "k" is not UTF-8`},
	} {
		_, err := s.Create(fmt.Sprintf("meta%d", i), "v", tc.meta)
		if tc.want == "" {
			if err != nil {
				t.Errorf("metadata %d: Create: %v", i, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("metadata %d: Create: %v, want %q", i, err, tc.want)
		}
		if _, err := s.Update("target", "v", tc.meta); err == nil || err.Error() != tc.want {
			t.Errorf("metadata %d: Update: %v, want %q", i, err, tc.want)
		}
	}
}

func TestKeyAndDirectory(t *testing.T) {
	_, dir := open(t)
	key := filepath.Join(dir, "key")
	fi, err := os.Stat(key)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("key file: %v, %v; want 32 bytes of mode 0600", fi, err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("directory has mode %04o, want 0700", fi.Mode().Perm())
	}
	good, _ := os.ReadFile(key)

	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T) error
		want  string
	}{
		{"key readable by others", func(*testing.T) error { return os.Chmod(key, 0o644) }, "key file " + key + " is open to group or others (mode 0644)"},
		{"key of the wrong size", func(*testing.T) error { return os.WriteFile(key, good[:16], 0o600) }, "key file " + key + " holds 16 bytes, want 32"},
		{"directory open to others", func(*testing.T) error { return os.Chmod(dir, 0o755) }, "directory " + dir + " is open to group or others (mode 0755)"},
		{"directory of another user", func(t *testing.T) error {
			if os.Geteuid() != 0 {
				t.Skip("only root can give the directory away")
			}
			return os.Chown(dir, 65534, 65534)
		}, "directory " + dir + " is not owned by uid 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() {
				os.Chown(dir, os.Geteuid(), os.Getegid())
				os.Chmod(dir, 0o700)
				os.WriteFile(key, good, 0o600)
				os.Chmod(key, 0o600)
			})
			if err := tc.spoil(t); err != nil {
				t.Fatal(err)
			}
			_, err := Open(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open = %v, want an error with %q", err, tc.want)
			}
		})
	}
	if _, err := Open(dir); err != nil {
		t.Errorf("Open after the repairs: %v", err)
	}
}

// TestOpenCleansUp: temporary files a crash left are removed; a file that
// is no secret is skipped and left alone.
func TestOpenCleansUp(t *testing.T) {
	s, dir := open(t)
	if _, err := s.Create("kept", "v", nil); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, ".tmp-123456")
	junk := filepath.Join(dir, "sec_00000000000000000000.json")
	for _, f := range []string{tmp, junk} {
		if err := os.WriteFile(f, []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := reopen(t, dir)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left: %v", err)
	}
	if _, err := os.Stat(junk); err != nil {
		t.Errorf("an unreadable secret's file was removed: %v", err)
	}
	if v, err := r.Value("kept"); err != nil || v != "v" {
		t.Errorf("Value(kept) = %q, %v", v, err)
	}
}

// TestErrorsHideHostPaths: a failed write says why, without the store's
// directory, since the error may reach a client.
func TestErrorsHideHostPaths(t *testing.T) {
	s, dir := open(t)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	_, err := s.Create("lost", "v", nil)
	if err == nil || strings.Contains(err.Error(), dir) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Create in a removed store: %v, want an error without %s", err, dir)
	}
}

func TestConcurrentCreate(t *testing.T) {
	s, _ := open(t)
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = s.Create("Same", fmt.Sprint(i), nil) })
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, ErrExists):
			t.Errorf("Create: %v, want ErrExists", err)
		}
	}
	if ok != 1 {
		t.Errorf("%d of %d concurrent Creates of one name succeeded, want 1", ok, n)
	}
	if page, _, _ := s.List(0, ""); len(page) != 1 {
		t.Errorf("store holds %d secrets, want 1", len(page))
	}
}

// TestConcurrentOpen: Opens that race to make a new store's key agree on
// one key.
func TestConcurrentOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	stores := make([]*Store, n)
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = Open(dir) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stores[i].Create(fmt.Sprintf("s%d", i), fmt.Sprintf("value%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	r := reopen(t, dir)
	for i := range n {
		if v, err := r.Value(fmt.Sprintf("s%d", i)); err != nil || v != fmt.Sprintf("value%d", i) {
			t.Errorf("Value(s%d) = %q, %v", i, v, err)
		}
	}
}
