// Package volume keeps E2B's volumes: named file systems of a fixed size
// that outlive sandboxes and the daemon, mounted into the sandboxes that
// ask for them and read and written through the API without one.
//
// A volume is a directory of the store:
//
//	<id>/volume.json  its id, name, size and creation time
//	<id>/image        an ext4 file system in a file of the volume's size,
//	                  its blocks reserved when it is made (the host's disk
//	                  cannot be overcommitted through volumes)
//	<id>/mnt          where the daemon mounts it (loop.go), once asked
//
// Files in a volume are owned as the sandboxes see them: the namespaces
// backend mounts it idmapped for each sandbox's user namespace, gVisor's
// gofer writes the ids its sandbox uses, so uid 1000 is "user" in every
// sandbox that mounts it. The daemon reaches files in a volume only
// beneath the descriptor of its root (files.go): whatever a sandbox left
// there, the daemon never follows it out.
package volume

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Errors of the store, for the API to answer with.
var (
	ErrNotFound = errors.New("volume not found")
	ErrInvalid  = errors.New("invalid volume")
)

// Volume is one volume's record.
type Volume struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Size    int64     `json:"sizeBytes"`
	Created time.Time `json:"created"`
}

// Store is the volumes under one directory.
type Store struct {
	dir      string
	size     int64
	idPrefix string
	log      *slog.Logger
	lock     *os.File // flock'd: one daemon's store at a time

	mu      sync.Mutex
	volumes map[string]*Volume // by id
	mounted map[string]bool    // by id: mounted at <id>/mnt by this process
}

// Open opens the store at dir, whose new volumes have size bytes and ids
// beginning with idPrefix (a cluster node's; "" alone), and mounts every
// volume: a volume is mounted for as long as the store is open, so that
// the mounts of sandboxes made before a restart (a paused one's, a
// snapshot's) find it where they were. What a crash left there is cleaned
// up first: a volume half made is removed, a mount left by the previous
// daemon is detached.
func Open(dir string, size int64, idPrefix string, log *slog.Logger) (*Store, error) {
	if size < MinSize {
		return nil, fmt.Errorf("volumes: a size of %d bytes is below the least, %d", size, MinSize)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	// One daemon mounts a store's volumes: another's Open would take
	// them from under the first one's sandboxes.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, errors.New("volumes: another airlock serve uses this state directory's volumes")
	}
	s := &Store{dir: dir, size: size, idPrefix: idPrefix, log: log, lock: lock, volumes: map[string]*Volume{}, mounted: map[string]bool{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	for _, e := range entries {
		if e.Name() == ".lock" {
			continue
		}
		path := filepath.Join(dir, e.Name())
		v, err := readRecord(path)
		switch {
		case strings.HasPrefix(e.Name(), ".new-") || strings.HasPrefix(e.Name(), ".deleted-") || errors.Is(err, fs.ErrNotExist):
			// Made or deleted only in part (Create and Delete order
			// their steps so): nothing refers to it.
			if err := removeVolumeDir(path); err != nil {
				return nil, fmt.Errorf("volumes: %w", err)
			}
			continue
		case err != nil || v.ID != e.Name() || !validID(v.ID):
			// Not a volume of ours, or one whose record cannot be
			// read now: left alone, never guessed at.
			log.Error("volumes: skipping an entry that is no readable volume", "entry", e.Name(), "err", err)
			continue
		}
		s.volumes[v.ID] = v
		// A volume the previous daemon mounted stays mounted (adopted:
		// sandboxes of it may live on); one it could not mount now is
		// there, unmounted, and said so when used.
		if isMountPoint(filepath.Join(path, "mnt")) {
			s.mounted[v.ID] = true
		} else if err := s.mount(v.ID, false); err != nil {
			log.Error("volumes: a volume cannot be mounted", "volume", v.ID, "err", err)
		}
	}
	return s, nil
}

// removeVolumeDir removes a volume's directory, lazily unmounting its
// mount point first if it is one (a sandbox's mount of it keeps it until
// the sandbox ends).
func removeVolumeDir(path string) error {
	if mnt := filepath.Join(path, "mnt"); isMountPoint(mnt) {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", filepath.Base(path), err)
		}
	}
	return os.RemoveAll(path)
}

// MinSize is the least size of a volume: ext4's journal and metadata
// need a few MiB.
const MinSize = 16 << 20

func readRecord(dir string) (*Volume, error) {
	b, err := os.ReadFile(filepath.Join(dir, "volume.json"))
	if err != nil {
		return nil, err
	}
	var v Volume
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// names are E2B's volume names.
var names = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,250}$`)

// Create makes a volume named name, of the store's size.
func (s *Store) Create(name string) (*Volume, error) {
	if !names.MatchString(name) {
		return nil, fmt.Errorf("%w: a name is 1 to 250 letters, digits, '_' and '-', got %q", ErrInvalid, name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.volumes {
		if v.Name == name {
			return nil, fmt.Errorf("%w: volume with name %q already exists", ErrInvalid, name)
		}
	}
	v := &Volume{ID: newID(s.idPrefix), Name: name, Size: s.size, Created: time.Now().UTC()}
	// Made under another name and renamed: a crash leaves a directory
	// without a record, which the next Open removes.
	tmp := filepath.Join(s.dir, ".new-"+v.ID)
	if err := makeVolume(tmp, v); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, v.ID)); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("volume: %w", err)
	}
	s.volumes[v.ID] = v
	if err := s.mount(v.ID, true); err != nil {
		delete(s.volumes, v.ID)
		os.RemoveAll(filepath.Join(s.dir, v.ID))
		return nil, err
	}
	return v, nil
}

// makeVolume makes v's directory at dir: its image, file system, mount
// point and record.
func makeVolume(dir string, v *Volume) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	image := filepath.Join(dir, "image")
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	// Every block reserved now: a volume never finds the host's disk
	// full later, and a host without room refuses it here.
	err = unix.Fallocate(int(f.Fd()), 0, 0, v.Size)
	f.Close()
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: the host has no room for a volume of %d MiB", ErrNoRoom, v.Size>>20)
	}
	if err != nil {
		return fmt.Errorf("volume: reserve its space: %w", err)
	}
	// Its root is user's (uid 1000 in every sandbox), no space kept for
	// root: all of it is the volume's. Its inode tables and journal are
	// zeroed now, not by the kernel once mounted.
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096",
		"-E", "root_owner=1000:1000,nodiscard,lazy_itable_init=0,lazy_journal_init=0", image).CombinedOutput()
	if err != nil {
		return fmt.Errorf("volume: mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Mkdir(filepath.Join(dir, "mnt"), 0o700); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	b, _ := json.Marshal(v)
	if err := os.WriteFile(filepath.Join(dir, "volume.json"), b, 0o600); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	return nil
}

// ErrNoRoom: the host's disk has no room for a volume.
var ErrNoRoom = errors.New("no room")

// Get returns the volume of id.
func (s *Store) Get(id string) (*Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.volumes[id]
	if v == nil {
		return nil, ErrNotFound
	}
	return v, nil
}

// ByName returns the volume named name.
func (s *Store) ByName(name string) (*Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.volumes {
		if v.Name == name {
			return v, nil
		}
	}
	return nil, fmt.Errorf("%w: volume %q", ErrNotFound, name)
}

// List returns every volume, oldest first.
func (s *Store) List() []*Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Volume, 0, len(s.volumes))
	for _, v := range s.volumes {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *Volume) int { return a.Created.Compare(b.Created) })
	return out
}

// Delete removes volume id and its files. As on E2B, sandboxes that
// mount it do not stop it: their mounts keep the file system until they
// end (a lazy unmount), and then it is gone.
func (s *Store) Delete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.volumes[id] == nil {
		return ErrNotFound
	}
	// Renamed first: a sandbox start or file request that resolves the
	// volume's path from now on finds nothing, never the bare mount
	// point of an unmounted volume (a directory of the host's disk). One
	// that resolved it before holds the mounted volume. A crash midway
	// leaves a ".deleted-" directory that the next Open removes.
	gone := filepath.Join(s.dir, ".deleted-"+id)
	if err := os.Rename(filepath.Join(s.dir, id), gone); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	delete(s.volumes, id)
	delete(s.mounted, id)
	return removeVolumeDir(gone)
}

// Mountpoint returns where volume id is mounted: the source of the
// sandboxes' mounts of it, and the root of its files.
func (s *Store) Mountpoint(id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.volumes[id] == nil {
		return "", ErrNotFound
	}
	if !s.mounted[id] {
		return "", fmt.Errorf("volume %s could not be mounted when the server started (its log says why)", id)
	}
	return filepath.Join(s.dir, id, "mnt"), nil
}

// mount mounts volume id at its mount point, and the first time (made
// now) removes mkfs's lost+found, no file of the volume's; s.mu is held,
// or s is not shared yet.
func (s *Store) mount(id string, first bool) error {
	mnt := filepath.Join(s.dir, id, "mnt")
	if err := mountImage(filepath.Join(s.dir, id, "image"), mnt); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	s.mounted[id] = true
	if first {
		if err := os.Remove(filepath.Join(mnt, "lost+found")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("volume: remove lost+found", "volume", id, "err", err)
		}
	}
	return nil
}

// Close unmounts every volume (lazily: a sandbox still ending keeps its
// own mount until it has).
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for id := range s.mounted {
		if err := unix.Unmount(filepath.Join(s.dir, id, "mnt"), unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: unmount: %w", id, err))
		}
		delete(s.mounted, id)
	}
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
	return errors.Join(errs...)
}

// newID returns a volume id: a UUID's form, as E2B's, whose first six
// hex digits are prefix (a cluster node's) if there is one.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant 10
	h := hex.EncodeToString(b[:])
	h = prefix + h[len(prefix):]
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

var ids = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func validID(id string) bool { return ids.MatchString(id) }
