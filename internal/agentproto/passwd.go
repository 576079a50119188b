package agentproto

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrNoUser: the passwd file has no such user.
var ErrNoUser = errors.New("no such user")

// maxPasswd bounds what LookupUser reads of a passwd file: the sandbox
// writes it, and a lookup must not read whatever it holds.
const maxPasswd = 1 << 20

// LookupUser finds name in passwd (the format of /etc/passwd) and
// returns its uid, gid and home. A sandbox's image may have any users
// (E2B's setUser takes them all); the file is the sandbox's, so only
// well-formed lines count, and ids beyond 32 bits are refused.
func LookupUser(passwd io.Reader, name string) (uid, gid int, home string, err error) {
	if !ValidUserName(name) {
		return 0, 0, "", fmt.Errorf("user %q: not a user name", name)
	}
	sc := bufio.NewScanner(io.LimitReader(passwd, maxPasswd))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) != 7 || f[0] != name {
			continue
		}
		u, err1 := strconv.ParseUint(f[2], 10, 32)
		g, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil || !strings.HasPrefix(f[5], "/") {
			return 0, 0, "", fmt.Errorf("user %q: its passwd entry is malformed", name)
		}
		return int(u), int(g), f[5], nil
	}
	if err := sc.Err(); err != nil {
		return 0, 0, "", err
	}
	return 0, 0, "", fmt.Errorf("user %q: %w", name, ErrNoUser)
}

// ValidUserName reports whether name can be a user's, as useradd takes
// them: a letter or underscore, then letters, digits, '_', '.', '-', at
// most 32 characters, with an optional trailing '$'.
func ValidUserName(name string) bool {
	if name == "" || len(name) > 32 {
		return false
	}
	for i, c := range strings.TrimSuffix(name, "$") {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_':
		case i > 0 && (c >= '0' && c <= '9' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return name != "$"
}
