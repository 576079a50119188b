// Package secret keeps the secrets of E2B's Secret API: values such as API
// keys that the egress proxy writes into requests' headers, encrypted at
// rest and never shown to a client once stored.
//
// A store is a directory of the daemon's, open to its user alone:
//
//	key          32 random bytes: the AES-256-GCM key of every value
//	<id>.json    one secret: its id, name, version, metadata, times, and
//	             its current value sealed (nonce, ciphertext and tag)
//
// A value is sealed with its secret's id and version as additional data:
// a ciphertext copied into another secret's file, or into its own at
// another version, does not open. Only the current version is kept, so a
// secret deleted is gone with all its versions.
package secret

import (
	"cmp"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Errors of the store, for the API to answer with. Every refusal of a bad
// name, value, metadata or list token is ErrInvalid to errors.Is, with a
// message of its own that names the problem.
var (
	ErrNotFound = errors.New("secret not found")
	ErrExists   = errors.New("a secret of that name exists")
	ErrInvalid  = errors.New("invalid secret")
)

// Limits. A name and a value are written into HTTP headers, so neither
// may be long; the metadata limits are E2B's.
const (
	maxName        = 256
	maxValue       = 16 << 10
	maxMetaEntries = 32
	maxMetaKey     = 128
	maxMetaValue   = 1024
	maxMetaTotal   = 8192

	defaultPage = 100
	maxPage     = 1000
)

const (
	idPrefix   = "sec_" // reserved: no name begins with it
	idChars    = 20     // base32hex, lower case: 100 random bits
	keyFile    = "key"
	keySize    = 32 // AES-256
	tempPrefix = ".tmp-"
)

// Info is what may be shown of a secret: everything but its value.
type Info struct {
	ID       string            // "sec_" and 20 random characters
	Name     string            // lower case
	Version  int64             // 1 when created, one more per Update
	Metadata map[string]string // never nil
	Created  time.Time
	Updated  time.Time
}

// Store is the secrets in one directory, all held in memory.
type Store struct {
	dir  string
	aead cipher.AEAD

	mu     sync.Mutex
	byID   map[string]*record
	byName map[string]*record
}

// record is a secret as its file holds it. A record is never changed once
// in the maps (Update makes a new one), so Value opens one outside the
// lock.
type record struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Version  int64             `json:"version"`
	Metadata map[string]string `json:"metadata"`
	Created  time.Time         `json:"created"`
	Updated  time.Time         `json:"updated"`
	Sealed   []byte            `json:"value"` // base64 in the file
}

// Open opens the store in dir, making dir and its key if they are
// missing. It fails only when the directory or the key cannot be trusted
// or read; a secret's file that does not parse is skipped, and temporary
// files a crash left are removed.
func Open(dir string) (*Store, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	key, err := loadKey(dir)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	s := &Store{dir: dir, aead: aead, byID: map[string]*record{}, byName: map[string]*record{}}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// checkDir makes dir if it is missing and refuses one that another user
// could read or change: the key lies beside the values it opens.
func checkDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("secrets: %s is not a directory", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("secrets: directory %s is not owned by uid %d, which runs the daemon", dir, os.Geteuid())
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("secrets: directory %s is open to group or others (mode %04o); it must be 0700", dir, fi.Mode().Perm())
	}
	return nil
}

// loadKey reads the store's key, making it first in a new store. A key is
// written whole under a temporary name and linked into place, which fails
// if the file exists: the key file is never seen half written, and Opens
// that race agree on the key that was linked first.
func loadKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, keyFile)
	// Three tries: a concurrent Open may link its key first (the next
	// read finds it) or remove our temporary file as a crash's leftover.
	for range 3 {
		key, err := readKey(path)
		if !errors.Is(err, fs.ErrNotExist) {
			return key, err
		}
		if err := makeKey(dir, path); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("secrets: make key file: %w", err)
		}
	}
	return nil, fmt.Errorf("secrets: key file %s: cannot be made", path)
}

// readKey reads a key file, refusing one that others could read or that
// is not a key. A missing file is fs.ErrNotExist.
func readKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("secrets: key file: %w", err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("secrets: key file %s is not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("secrets: key file %s is open to group or others (mode %04o); it must be 0600", path, fi.Mode().Perm())
	case fi.Size() != keySize:
		return nil, fmt.Errorf("secrets: key file %s holds %d bytes, want %d", path, fi.Size(), keySize)
	}
	key := make([]byte, keySize)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("secrets: key file %s: %w", path, err)
	}
	return key, nil
}

// makeKey links a new random key at path; fs.ErrExist if one is there.
func makeKey(dir, path string) error {
	tmp, err := writeTemp(dir, string(randomBytes(keySize)))
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

// load reads every secret's file into the maps and removes temporary
// files, which only a crash leaves.
func (s *Store) load() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, tempPrefix) {
			os.Remove(filepath.Join(s.dir, name))
			continue
		}
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || !validID(id) {
			continue
		}
		r, err := readRecord(filepath.Join(s.dir, name))
		if err != nil || r.ID != id {
			continue
		}
		if _, dup := s.byName[r.Name]; dup {
			continue // never written so; the first file by name wins
		}
		s.byID[r.ID], s.byName[r.Name] = r, r
	}
	return nil
}

// readRecord reads one secret's file, refusing a record the store would
// not have written.
func readRecord(path string) (*record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if ValidName(r.Name) != nil || strings.ToLower(r.Name) != r.Name || r.Version < 1 || len(r.Sealed) == 0 {
		return nil, errors.New("not a secret's record")
	}
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
	return &r, nil
}

// Create stores a new secret of version 1; its name is lower-cased.
func (s *Store) Create(name, value string, meta map[string]string) (Info, error) {
	if err := ValidName(name); err != nil {
		return Info{}, err
	}
	if err := validValue(value); err != nil {
		return Info{}, err
	}
	if err := validMetadata(meta); err != nil {
		return Info{}, err
	}
	name = strings.ToLower(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byName[name]; ok {
		return Info{}, fmt.Errorf("%w: %q", ErrExists, name)
	}
	now := time.Now().UTC()
	r := &record{ID: newID(), Name: name, Version: 1, Metadata: cloneMetadata(meta), Created: now, Updated: now}
	r.Sealed = s.aead.Seal(nil, nil, []byte(value), additionalData(r.ID, r.Version))
	if err := s.save(r); err != nil {
		os.Remove(s.path(r.ID)) // in case only the directory's sync failed
		return Info{}, fmt.Errorf("store secret %s: %w", r.ID, err)
	}
	s.byID[r.ID], s.byName[r.Name] = r, r
	return r.info(), nil
}

// Update replaces a secret's value as its next version. A nil meta keeps
// its metadata; any other replaces it.
func (s *Store) Update(idOrName, value string, meta map[string]string) (Info, error) {
	if err := validValue(value); err != nil {
		return Info{}, err
	}
	if meta != nil {
		if err := validMetadata(meta); err != nil {
			return Info{}, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.find(idOrName)
	if err != nil {
		return Info{}, err
	}
	r := *old
	r.Version++
	r.Updated = time.Now().UTC()
	if meta != nil {
		r.Metadata = cloneMetadata(meta)
	}
	r.Sealed = s.aead.Seal(nil, nil, []byte(value), additionalData(r.ID, r.Version))
	if err := s.save(&r); err != nil {
		return Info{}, fmt.Errorf("store secret %s: %w", r.ID, err)
	}
	s.byID[r.ID], s.byName[r.Name] = &r, &r
	return r.info(), nil
}

// Get returns what may be shown of a secret.
func (s *Store) Get(idOrName string) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.find(idOrName)
	if err != nil {
		return Info{}, err
	}
	return r.info(), nil
}

// Delete removes a secret and, with its one file, every version of it.
func (s *Store) Delete(idOrName string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.find(idOrName)
	if err != nil {
		return err
	}
	if err := os.Remove(s.path(r.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete secret %s: %w", r.ID, withoutPath(err))
	}
	// The file is gone: so is the secret, even if the directory's sync
	// below fails.
	delete(s.byID, r.ID)
	delete(s.byName, r.Name)
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("delete secret %s: %w", r.ID, withoutPath(err))
	}
	return nil
}

// List returns a page of secrets in the order they were created. next is
// "" for the first page, else the token the previous page returned; the
// token returned is "" after the last page. A token names the last secret
// of its page by creation time and ID, so a page still follows on when
// that secret has been deleted since.
func (s *Store) List(limit int, next string) (page []Info, nextToken string, err error) {
	if limit <= 0 {
		limit = defaultPage
	}
	limit = min(limit, maxPage)
	var after cursor
	if next != "" {
		if after, err = parseToken(next); err != nil {
			return nil, "", err
		}
	}
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.byID))
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b *record) int { return a.cursor().compare(b.cursor()) })
	start := 0
	if next != "" {
		i, found := slices.BinarySearchFunc(all, after, func(r *record, c cursor) int { return r.cursor().compare(c) })
		if found {
			i++
		}
		start = i
	}
	end := min(start+limit, len(all))
	page = make([]Info, 0, end-start)
	for _, r := range all[start:end] {
		page = append(page, r.info())
	}
	if end < len(all) {
		nextToken = all[end-1].cursor().token()
	}
	return page, nextToken, nil
}

// Value returns a secret's current value, for the egress proxy to write
// into a request; it is the only way out of the store for a value.
func (s *Store) Value(name string) (string, error) {
	s.mu.Lock()
	r, err := s.find(name)
	s.mu.Unlock()
	if err != nil {
		return "", err
	}
	plain, err := s.aead.Open(nil, nil, r.Sealed, additionalData(r.ID, r.Version))
	if err != nil {
		return "", fmt.Errorf("secret %s: its value does not decrypt with the store's key: its file was changed", r.ID)
	}
	return string(plain), nil
}

// find returns the record idOrName names: an ID if it begins with "sec_",
// which no name may, else a name. Both are looked up in lower case. The
// caller holds s.mu.
func (s *Store) find(idOrName string) (*record, error) {
	key := strings.ToLower(idOrName)
	var r *record
	if strings.HasPrefix(key, idPrefix) {
		r = s.byID[key]
	} else {
		r = s.byName[key]
	}
	if r == nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, idOrName)
	}
	return r, nil
}

// save writes r's file whole or not at all: a crash leaves the old file
// or the new one, and at worst a temporary file that Open removes. Its
// errors name no host path: they may reach a client.
func (s *Store) save(r *record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := writeTemp(s.dir, string(b))
	if err != nil {
		return withoutPath(err)
	}
	if err := os.Rename(tmp, s.path(r.ID)); err != nil {
		os.Remove(tmp)
		return withoutPath(err)
	}
	return withoutPath(syncDir(s.dir))
}

func (s *Store) path(id string) string { return filepath.Join(s.dir, id+".json") }

// writeTemp writes data to a new file of mode 0600 in dir, synced, and
// returns its path.
func writeTemp(dir, data string) (string, error) {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return "", err
	}
	_, err = f.WriteString(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// syncDir makes a rename, link or removal in dir survive a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// withoutPath drops the host path from a file system error, keeping the
// operation and the cause (errors.Is still finds the errno).
func withoutPath(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	case errors.As(err, &le):
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}

// additionalData binds a sealed value to its secret and version.
func additionalData(id string, version int64) []byte {
	return []byte("airlock secret\x00" + id + "\x00" + strconv.FormatInt(version, 10))
}

func (r *record) info() Info {
	return Info{ID: r.ID, Name: r.Name, Version: r.Version, Metadata: cloneMetadata(r.Metadata), Created: r.Created, Updated: r.Updated}
}

// cloneMetadata copies meta, so that no caller shares a record's map; it
// is never nil.
func cloneMetadata(meta map[string]string) map[string]string {
	m := make(map[string]string, len(meta))
	maps.Copy(m, meta)
	return m
}

var idEncoding = base32.HexEncoding.WithPadding(base32.NoPadding)

func newID() string {
	// 13 bytes are 21 base32 characters; the first 20 carry 100 bits.
	return idPrefix + strings.ToLower(idEncoding.EncodeToString(randomBytes(13))[:idChars])
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b) // never fails: it crashes the program rather
	return b
}

// validID says whether id is one newID could have made: the name of a
// file of the store is made from it.
func validID(id string) bool {
	rest, ok := strings.CutPrefix(id, idPrefix)
	if !ok || len(rest) != idChars {
		return false
	}
	for _, c := range rest {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'v') {
			return false
		}
	}
	return true
}

// cursor is a secret's place in List's order.
type cursor struct {
	created int64 // Unix nanoseconds
	id      string
}

func (r *record) cursor() cursor { return cursor{r.Created.UnixNano(), r.ID} }

func (c cursor) compare(d cursor) int {
	return cmp.Or(cmp.Compare(c.created, d.created), strings.Compare(c.id, d.id))
}

func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.created, 10) + "." + c.id))
}

func parseToken(token string) (cursor, error) {
	bad := invalid("secret list: the next token is not one this store gave")
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return cursor{}, bad
	}
	ns, id, ok := strings.Cut(string(b), ".")
	created, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !validID(id) {
		return cursor{}, bad
	}
	return cursor{created, id}, nil
}

// ValidName says whether name, lower-cased, may name a secret. A name is
// written into a "${e2b.secrets.<name>}" placeholder and into headers, so
// it has no braces, '$', whitespace or control characters; "sec_" is the
// prefix of IDs.
func ValidName(name string) error {
	switch {
	case name == "":
		return invalid("secret name is empty")
	case len(name) > maxName:
		return invalid("secret name is longer than %d bytes", maxName)
	case !utf8.ValidString(name):
		return invalid("secret name %q is not UTF-8", name)
	}
	lower := strings.ToLower(name)
	switch {
	case len(lower) > maxName:
		return invalid("secret name is longer than %d bytes", maxName)
	case strings.HasPrefix(lower, idPrefix):
		return invalid("secret name %q may not begin with %q, which is reserved for IDs", name, idPrefix)
	}
	for _, c := range lower {
		switch {
		case c == '{' || c == '}':
			return invalid("secret name %q may not contain '{' or '}'", name)
		case c == '$':
			return invalid("secret name %q may not contain '$'", name)
		case unicode.IsSpace(c):
			return invalid("secret name %q may not contain whitespace", name)
		case unicode.IsControl(c):
			return invalid("secret name %q may not contain control characters", name)
		}
	}
	return nil
}

// validValue refuses a value that cannot go into an HTTP header value.
// Its errors never repeat the value.
func validValue(value string) error {
	switch {
	case value == "":
		return invalid("secret value is empty")
	case len(value) > maxValue:
		return invalid("secret value is %d bytes, more than %d", len(value), maxValue)
	case !policy.ValidHeaderValue(value):
		return invalid("secret value may not contain a control character but the tab: it is sent in an HTTP header")
	}
	return nil
}

// validMetadata applies E2B's limits to metadata. Its keys and values are
// stored as JSON strings, so they must be UTF-8 to come back as they were.
func validMetadata(meta map[string]string) error {
	if len(meta) > maxMetaEntries {
		return invalid("secret metadata: at most %d entries", maxMetaEntries)
	}
	total := 0
	// In order, so that the same metadata is always refused for the
	// same reason.
	for _, k := range slices.Sorted(maps.Keys(meta)) {
		v := meta[k]
		switch {
		case k == "":
			return invalid("secret metadata: a key is empty")
		case len(k) > maxMetaKey:
			return invalid("secret metadata key %.40q… is longer than %d bytes", k, maxMetaKey)
		case len(v) > maxMetaValue:
			return invalid("secret metadata value of %q is longer than %d bytes", k, maxMetaValue)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return invalid("secret metadata %q is not UTF-8", k)
		}
		total += len(k) + len(v)
	}
	if total > maxMetaTotal {
		return invalid("secret metadata: keys and values total %d bytes, more than %d", total, maxMetaTotal)
	}
	return nil
}

// invalidError is a request the store refuses: ErrInvalid to errors.Is,
// with a one-line message of its own.
type invalidError string

func (e invalidError) Error() string        { return string(e) }
func (e invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(format string, args ...any) error {
	return invalidError(fmt.Sprintf(format, args...))
}
