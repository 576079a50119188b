// Package console serves Airlock's web console: a page built from
// console/ (make build) and embedded here, which does everything through
// the same API and API key as the SDKs.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed dist
var dist embed.FS

// csp is the console's Content Security Policy: its own scripts only, no
// inline ones, no plugins, nothing framed from elsewhere, not framed
// itself, and no request but to this server. A sandbox's HTML output is
// shown in an iframe sandboxed to an opaque origin without scripts
// (src/output.tsx): no policy here is what keeps it from the console.
// Styles may be inline: the terminal (xterm.js) sets its own.
const csp = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; " +
	"font-src 'self'; connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console: index.html at / and its assets.
func Handler() http.Handler {
	root, _ := fs.Sub(dist, "dist")
	files := http.FileServerFS(root)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		if _, err := fs.Stat(root, "index.html"); err != nil {
			h.Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte("This airlock was built without its console: build it with make build.\n"))
			return
		}
		if r.URL.Path == "/" || strings.HasSuffix(r.URL.Path, ".html") {
			h.Set("Cache-Control", "no-cache")
		} else {
			// Assets are named by their content.
			h.Set("Cache-Control", "public, max-age=31536000, immutable")
		}
		files.ServeHTTP(w, r)
	})
}
