package image

import (
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
)

// blob is a layer as its source holds it (a registry's or an OCI
// layout's blob, compressed or not), checked against the digest and size
// its manifest gives in the same pass that unpacks it: every byte read
// is hashed, and finish reads it to its end, so that the digest covers
// the whole stream and not what the decompressor and the tar reader
// happened to consume.
type blob struct {
	v1.Layer
	r   io.Reader
	h   hash.Hash
	n   int64
	err error // the first the source returned: io.EOF at its end
}

// checking returns l as a layer whose uncompressed stream is read from
// its blob through b, decompressed as go-containerregistry would.
func checking(l v1.Layer) (v1.Layer, *blob, error) {
	want, err := l.Digest()
	if err != nil {
		return nil, nil, err
	}
	h, err := v1.Hasher(want.Algorithm)
	if err != nil {
		return nil, nil, refuse("the layer's digest %s: %v", want, err)
	}
	b := &blob{Layer: l, h: h}
	cl, err := partial.CompressedToLayer(b)
	return cl, b, err
}

// Compressed opens the blob, to be read through b.
func (b *blob) Compressed() (io.ReadCloser, error) {
	rc, err := b.Layer.Compressed()
	if err != nil {
		return nil, err
	}
	b.r = rc
	return struct {
		io.Reader
		io.Closer
	}{b, rc}, nil
}

func (b *blob) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	if err != nil && b.err == nil {
		b.err = err
	}
	return n, err
}

// finish reads what is left of the blob, at most a byte past the size
// its manifest gives, and reports whether it is the blob its digest
// names. A blob that is not outranks any other complaint about the
// layer: what was unpacked of it was not the image's.
func (b *blob) finish() error {
	want, err := b.Digest()
	if err != nil {
		return err
	}
	size, err := b.Size()
	if err != nil {
		return err
	}
	if b.r == nil {
		return errors.New("the layer's blob was never read")
	}
	if b.err == nil {
		io.CopyN(io.Discard, b, max(size+1-b.n, 1))
	}
	switch {
	case b.n < size && (errors.Is(b.err, io.EOF) || errors.Is(b.err, io.ErrUnexpectedEOF)):
		// A file that ends early, or a response shorter than it said.
		return refuse("the layer is cut short: %d of the %d bytes its manifest gives", b.n, size)
	case b.n < size:
		// The source failed: the network, or a check of the registry
		// client's own.
		return fmt.Errorf("the layer ended after %d of its %d bytes: %w", b.n, size, b.err)
	case b.n > size || b.err == nil:
		return refuse("the layer is longer than the %d bytes its manifest gives", size)
	case hex.EncodeToString(b.h.Sum(nil)) != want.Hex:
		return refuse("the layer's content does not match its digest %s", want)
	}
	// A registry's reader may end with an error of its own for a blob
	// that is the digest's: none is left to report.
	return nil
}
