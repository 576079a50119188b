//go:build !amd64

package nsinit

import (
	"fmt"
	"runtime"
)

// installSeccomp fails closed where no syscall table has been written: a
// sandbox never runs without its filter.
func installSeccomp() error {
	return fmt.Errorf("no seccomp filter for %s: refusing to run unfiltered", runtime.GOARCH)
}
