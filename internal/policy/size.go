package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize parses a byte count such as "512M", "1G", "64Ki" or "1048576".
// Suffixes K, M, G, T are binary multiples (as in docker and ulimit); an
// optional trailing "i" or "B" is accepted.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "i")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			shift = 10
		case 'm', 'M':
			shift = 20
		case 'g', 'G':
			shift = 30
		case 't', 'T':
			shift = 40
		}
		if shift > 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || t == "" || strings.ContainsAny(t, "xXpPeE_") {
		return 0, fmt.Errorf("size %q is not a number with an optional K, M, G or T suffix", s)
	}
	v *= float64(int64(1) << shift)
	if math.IsNaN(v) || v < 0 || v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is out of range", s)
	}
	return int64(v), nil
}

// FormatSize renders n bytes the way ParseSize reads them, exactly when it can.
func FormatSize(n int64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
