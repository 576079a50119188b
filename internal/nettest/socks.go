package nettest

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// serveSOCKS serves a SOCKS5 proxy on ln until it closes: username and
// password authentication only (SOCKSUser, SOCKSPassword), CONNECT to an
// IPv4 address or a name, nothing else.
func serveSOCKS(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			out, err := socksHandshake(c)
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
func socksHandshake(c net.Conn) (net.Conn, error) {
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
	var host string
	switch req[3] {
	case 1:
		a, err := read(4)
		if err != nil {
			return nil, err
		}
		host = netip.AddrFrom4([4]byte(a)).String()
	case 3:
		n, err := read(1)
		if err != nil {
			return nil, err
		}
		name, err := read(int(n[0]))
		if err != nil {
			return nil, err
		}
		host = string(name)
	default:
		c.Write([]byte{5, 8, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, io.ErrUnexpectedEOF
	}
	p, err := read(2)
	if err != nil {
		return nil, err
	}
	out, err := net.DialTimeout("tcp4", net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(p)))), 5*time.Second)
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
