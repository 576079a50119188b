package nettest

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"time"
)

// serveSOCKS serves a SOCKS5 proxy on ln until it closes: username and
// password authentication only (SOCKSUser, SOCKSPassword), CONNECT to an
// IPv4 address of the lab, nothing else. dial connects from inside the
// lab's internet: a goroutine's own thread may be in any namespace, and
// a socket made there would leave the machine.
func serveSOCKS(ln net.Listener, dial func(addr netip.AddrPort) (net.Conn, error)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			out, err := socksHandshake(c, dial)
			if err != nil {
				return
			}
			defer out.Close()
			c.SetDeadline(time.Time{})
			done := make(chan struct{})
			go func() { io.Copy(out, c); out.(*net.TCPConn).CloseWrite(); close(done) }()
			io.Copy(c, out)
			c.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}

// socksHandshake authenticates the client and connects where it asks.
func socksHandshake(c net.Conn, dial func(addr netip.AddrPort) (net.Conn, error)) (net.Conn, error) {
	read := func(n int) ([]byte, error) {
		b := make([]byte, n)
		_, err := io.ReadFull(c, b)
		return b, err
	}
	hello, err := read(2)
	if err != nil || hello[0] != 5 {
		return nil, io.ErrUnexpectedEOF
	}
	methods, err := read(int(hello[1]))
	if err != nil {
		return nil, err
	}
	userPass := false
	for _, m := range methods {
		userPass = userPass || m == 2
	}
	if !userPass {
		c.Write([]byte{5, 0xff})
		return nil, io.ErrUnexpectedEOF
	}
	c.Write([]byte{5, 2})
	head, err := read(2)
	if err != nil {
		return nil, err
	}
	user, _ := read(int(head[1]))
	plen, _ := read(1)
	if len(plen) != 1 {
		return nil, io.ErrUnexpectedEOF
	}
	pass, _ := read(int(plen[0]))
	if string(user) != SOCKSUser || string(pass) != SOCKSPassword {
		c.Write([]byte{1, 1})
		return nil, io.ErrUnexpectedEOF
	}
	c.Write([]byte{1, 0})
	req, err := read(4)
	if err != nil || req[0] != 5 || req[1] != 1 {
		return nil, io.ErrUnexpectedEOF
	}
	if req[3] != 1 { // an IPv4 address; a name would be looked up outside
		c.Write([]byte{5, 8, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, io.ErrUnexpectedEOF
	}
	a, err := read(4)
	if err != nil {
		return nil, err
	}
	p, err := read(2)
	if err != nil {
		return nil, err
	}
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(a)), binary.BigEndian.Uint16(p))
	if !labAddr(dst.Addr()) {
		c.Write([]byte{5, 2, 0, 1, 0, 0, 0, 0, 0, 0}) // not allowed by the ruleset
		return nil, io.ErrUnexpectedEOF
	}
	out, err := dial(dst)
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, err
	}
	bound := out.LocalAddr().(*net.TCPAddr)
	reply := append([]byte{5, 0, 0, 1}, bound.IP.To4()...)
	reply = binary.BigEndian.AppendUint16(reply, uint16(bound.Port))
	c.Write(reply)
	return out, nil
}

// labAddr reports whether a is one of the lab's internet's hosts.
func labAddr(a netip.Addr) bool {
	for _, p := range []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("198.51.100.0/24")} {
		if p.Contains(a) {
			return true
		}
	}
	return a == PrivateAddr
}
