package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The cgroup file system's files, read and written alike on v1 and v2,
// and the kernel's part in killing and removing.

// waitFile polls file until done says its content is what it waits for,
// for at most 5 s or until ctx ends.
func waitFile(ctx context.Context, dir, file string, done func(string) bool) error {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		if done(strings.TrimSpace(string(data))) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %s stayed %q", filepath.Base(dir), file, strings.TrimSpace(string(data)))
		}
	}
}

func writeFile(dir, file string, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("set cgroup %s: %w", file, err)
	}
	return nil
}

func readUint(dir, file string) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(bytes.TrimSpace(data)), 10, 64)
}

// readKey returns the value of "key N" in a flat-keyed cgroup file.
func readKey(dir, file, key string) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+" "); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", file, key)
}

// pageCache is the page cache of files in a cgroup's memory.stat, its
// cache key less its shared memory's (tmpfs, memfds). It is only ever
// shown, never acted on: a kernel without either key counts as none.
func pageCache(dir, cache, shmem string) int64 {
	c, err := readKey(dir, "memory.stat", cache)
	if err != nil {
		return 0
	}
	sh, _ := readKey(dir, "memory.stat", shmem)
	if sh > c {
		return 0
	}
	return int64(c - sh)
}

// pids lists the processes in a cgroup directory's cgroup.procs.
func pids(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killAll SIGKILLs every process listed in dir until none is left. Without
// a freezer a process can fork between listing and killing; the next round
// catches the child, and the pids limit bounds how many rounds there are.
func (t *tree) killAll(dir string) error {
	name := filepath.Base(dir)
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := pids(dir)
		if errors.Is(err, os.ErrNotExist) || (err == nil && len(pids) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes survived SIGKILL", len(pids))
		}
		for _, pid := range pids {
			t.kill(pid, name)
		}
		time.Sleep(time.Millisecond)
	}
}

// killInCgroup SIGKILLs pid if it is in cgroup cgroupName. The kill goes
// through a pidfd taken before checking that the pid is in the cgroup,
// so a pid reused by a host process is never hit.
func killInCgroup(pid int, cgroupName string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone
	}
	defer unix.Close(fd)
	// With the pidfd held, pid cannot be reused: check it is ours. On v1
	// a single thread may be in the cgroup (init's forking thread), so
	// every thread counts.
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/cgroup", pid, task.Name()))
		if err == nil && strings.Contains(string(data), "/"+cgroupName+"\n") {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			return
		}
	}
}

// remove removes a cgroup directory. The kernel can answer EBUSY for a
// moment after the last process left, while it finishes tearing it down.
func (t *tree) remove(dir string) error {
	for i := 0; ; i++ {
		err := t.rmdir(dir)
		switch {
		case err == nil || errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY) && i < 100:
			time.Sleep(time.Millisecond)
		default:
			return fmt.Errorf("remove cgroup %s: %w", filepath.Base(dir), err)
		}
	}
}
