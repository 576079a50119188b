package filesystem

import (
	"net/http"
	"strings"
	"testing"
)

// FuzzUploadMetadata: an upload's X-Metadata-* headers become metadata
// of printable US-ASCII keys (lower case, within the xattr name limit)
// and values, within envd's budget, one per header; any other header
// is not metadata.
func FuzzUploadMetadata(f *testing.F) {
	f.Add("X-Metadata-Owner", "alice", "X-Metadata-Team", "a b")
	f.Add("x-metadata-OWNER", "alice", "X-Metadata-owner", "bob")
	f.Add("X-Metadata-", "x", "X-Metadat", "y")
	f.Add("X-Metadata-"+strings.Repeat("k", 250), "v", "X-Metadata-v", strings.Repeat("v", 5000))
	f.Add("X-Metadata-k\x00", "v", "X-Metadata-ключ", "値")
	f.Add("X-Metadata-a", "\n", "Content-Type", "text/plain")
	f.Fuzz(func(t *testing.T, name1, value1, name2, value2 string) {
		h := http.Header{}
		h[name1] = append(h[name1], value1)
		h[name2] = append(h[name2], value2)
		md, e := UploadMetadata(h)
		if e != nil {
			return
		}
		size := 0
		for k, v := range md {
			if k == "" || k != strings.ToLower(k) || len(k) > maxMetadataKey || !printable(k) || !printable(v) {
				t.Errorf("metadata %q=%q from %q", k, v, h)
			}
			if !strings.EqualFold(name1, metadataHeader+k) && !strings.EqualFold(name2, metadataHeader+k) {
				t.Errorf("metadata %q is of no header of %q", k, h)
			}
			size += len(metadataXattr) + len(k) + len(v)
		}
		if len(md) > 2 {
			t.Errorf("%d keys of metadata from 2 headers", len(md))
		}
		if size > maxMetadataSize {
			t.Errorf("metadata of %d bytes, past %d", size, maxMetadataSize)
		}
	})
}
