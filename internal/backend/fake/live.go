package fake

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/backend"
)

// Live restore without another process: with KeepAlive, instances are
// Adoptable, and a manager that shuts down leaves them running, as a
// keeper keeps a daemon's; Reattach then stands for a later process
// finding them, Adopt takes one back (the same Instance), and
// DropUnadopted kills the rest. Network namespaces are not kept: the
// fake's instances have none of their own.

var (
	_ backend.Adopter   = (*Backend)(nil)
	_ backend.Adoptable = (*Instance)(nil)
)

// KeepAlive makes instances started from now on outlive their manager.
func (b *Backend) KeepAlive() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keepAlive = true
}

// Reattach marks every instance still running as kept, for Adopt.
func (b *Backend) Reattach() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kept = map[string]*Instance{}
	for _, i := range b.instances {
		select {
		case <-i.done:
		default:
			if i.keep {
				b.kept[i.Handle()] = i
			}
		}
	}
}

// Handle names a kept instance: its directory's name; "" if it ends with
// its manager.
func (i *Instance) Handle() string {
	if !i.keep {
		return ""
	}
	return filepath.Base(i.dir)
}

// Adopt takes back the kept instance handle.
func (b *Backend) Adopt(_ context.Context, handle string) (backend.Instance, *os.File, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.kept[handle]
	if i == nil {
		return nil, nil, fmt.Errorf("no running sandbox %s was kept", handle)
	}
	delete(b.kept, handle)
	return i, nil, nil
}

// DropUnadopted kills and removes the kept instances no Adopt took.
func (b *Backend) DropUnadopted() {
	b.mu.Lock()
	left := b.kept
	b.kept = nil
	b.mu.Unlock()
	for _, i := range left {
		i.Kill(context.Background())
		i.Wait()
	}
}
