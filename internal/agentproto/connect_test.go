package agentproto

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
)

func TestReadEnvelope(t *testing.T) {
	const limit = 8
	for _, tc := range []struct {
		name      string
		in        []byte
		wantFlags byte
		wantMsg   string
		wantErr   error
	}{
		{"empty input", nil, 0, "", io.EOF},
		{"cut-off header", []byte{0, 0, 0}, 0, "", io.ErrUnexpectedEOF},
		{"cut-off message", []byte{0, 0, 0, 0, 4, 'a', 'b'}, 0, "", io.ErrUnexpectedEOF},
		{"header without its message", []byte{0, 0, 0, 0, 1}, 0, "", io.ErrUnexpectedEOF},
		{"message", []byte{0, 0, 0, 0, 2, '{', '}', 'x'}, 0, "{}", nil},
		{"empty message", []byte{0, 0, 0, 0, 0}, 0, "", nil},
		{"end of stream", []byte{FlagEndStream, 0, 0, 0, 2, '{', '}'}, FlagEndStream, "{}", nil},
		{"reserved flags pass", []byte{0x80, 0, 0, 0, 1, 'x'}, 0x80, "x", nil},
		{"exactly the limit", append([]byte{0, 0, 0, 0, limit}, "12345678"...), 0, "12345678", nil},
		{"one above the limit", append([]byte{0, 0, 0, 0, limit + 1}, "123456789"...), 0, "", ErrTooLarge},
		{"largest claim", []byte{0, 0xff, 0xff, 0xff, 0xff}, 0, "", ErrTooLarge},
		{"compressed", []byte{FlagCompressed, 0, 0, 0, 1, 'x'}, 0, "", ErrCompressed},
		{"compressed end of stream", []byte{FlagCompressed | FlagEndStream, 0, 0, 0, 0}, 0, "", ErrCompressed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags, msg, err := ReadEnvelope(bytes.NewReader(tc.in), limit)
			if err != tc.wantErr {
				t.Fatalf("got error %v, want %v", err, tc.wantErr)
			}
			if flags != tc.wantFlags || string(msg) != tc.wantMsg {
				t.Errorf("got flags %#x message %q, want %#x %q", flags, msg, tc.wantFlags, tc.wantMsg)
			}
		})
	}
}

func TestWriteEnvelope(t *testing.T) {
	for _, tc := range []struct {
		flags byte
		msg   string
		want  []byte
	}{
		{0, `{}`, []byte{0, 0, 0, 0, 2, '{', '}'}},
		{FlagEndStream, ``, []byte{2, 0, 0, 0, 0}},
		{0, string(make([]byte, 0x10203)), append([]byte{0, 0, 1, 2, 3}, make([]byte, 0x10203)...)},
	} {
		var b bytes.Buffer
		if err := WriteEnvelope(&b, tc.flags, []byte(tc.msg)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), tc.want) {
			t.Errorf("WriteEnvelope(%#x, %d bytes): got header % x, want % x", tc.flags, len(tc.msg), b.Bytes()[:5], tc.want[:5])
		}
	}
}

// allocated is how many bytes fn allocated on the heap.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// slack covers what the runtime counts besides the message: small
// allocations are counted a span at a time.
const slack = 64 << 10

func TestReadEnvelopeDoesNotTrustTheLength(t *testing.T) {
	claim := []byte{0, 0xff, 0xff, 0xff, 0xff, 'x'}
	var err error
	if n := allocated(func() { _, _, err = ReadEnvelope(bytes.NewReader(claim), 16<<20) }); n > slack {
		t.Errorf("a 4 GiB claim allocated %d bytes", n)
	}
	if err != ErrTooLarge {
		t.Errorf("got %v, want ErrTooLarge", err)
	}
}

// FuzzEnvelopeRoundTrip: any message written reads back identically, and
// is refused by a reader whose bound it exceeds.
func FuzzEnvelopeRoundTrip(f *testing.F) {
	f.Add(byte(0), []byte(`{"event":{"start":{"pid":1}}}`))
	f.Add(FlagEndStream, []byte(`{"error":{"code":"not_found","message":"x"}}`))
	f.Add(byte(0), []byte{})
	f.Add(FlagCompressed, []byte("x"))
	f.Fuzz(func(t *testing.T, flags byte, msg []byte) {
		var b bytes.Buffer
		if err := WriteEnvelope(&b, flags, msg); err != nil {
			t.Fatal(err)
		}
		if b.Len() != 5+len(msg) {
			t.Fatalf("wrote %d bytes for a %d-byte message", b.Len(), len(msg))
		}
		wire := bytes.Clone(b.Bytes())
		gotFlags, got, err := ReadEnvelope(&b, len(msg))
		if flags&FlagCompressed != 0 {
			if err != ErrCompressed {
				t.Fatalf("compressed envelope: got %v, want ErrCompressed", err)
			}
			return
		}
		if err != nil || gotFlags != flags || !bytes.Equal(got, msg) {
			t.Fatalf("wrote %#x %q, read %#x %q, %v", flags, msg, gotFlags, got, err)
		}
		if _, _, err := ReadEnvelope(&b, len(msg)); err != io.EOF {
			t.Fatalf("after the envelope: got %v, want io.EOF", err)
		}
		if len(msg) > 0 {
			if _, _, err := ReadEnvelope(bytes.NewReader(wire), len(msg)-1); err != ErrTooLarge {
				t.Fatalf("a reader bound below the message: got %v, want ErrTooLarge", err)
			}
		}
	})
}

// FuzzReadEnvelope: arbitrary bytes never panic, never yield a message
// above the bound, and never make the reader allocate more than they
// hold plus one bounded message (a claimed length is not trusted).
func FuzzReadEnvelope(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 2, '{', '}', 2, 0, 0, 0, 2, '{', '}'}, uint16(16))
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff}, uint16(1024))
	f.Add([]byte{0, 0, 0, 1, 0, 'x'}, uint16(512))
	f.Add([]byte{FlagCompressed, 0, 0, 0, 0}, uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, limit uint16) {
		r := bytes.NewReader(data)
		n := allocated(func() {
			for {
				flags, msg, err := ReadEnvelope(r, int(limit))
				if err != nil {
					if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, ErrTooLarge) && err != ErrCompressed {
						t.Errorf("unexpected error %v", err)
					}
					return
				}
				if len(msg) > int(limit) {
					t.Errorf("read a %d-byte message past the bound %d", len(msg), limit)
				}
				if flags&FlagCompressed != 0 {
					t.Errorf("a compressed envelope was read")
				}
			}
		})
		if bound := uint64(len(data)) + uint64(limit) + slack; n > bound {
			t.Errorf("%d bytes of input with a bound of %d allocated %d bytes", len(data), limit, n)
		}
	})
}
