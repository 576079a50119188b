package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The page and its assets come with the console's policy; without a
// build, / says how to make one.
func TestHandler(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	csp := rec.Header().Get("Content-Security-Policy")
	for _, want := range []string{"script-src 'self';", "default-src 'none'", "frame-ancestors 'none'", "connect-src 'self'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("policy %q lacks %q", csp, want)
		}
	}
	if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Error("no nosniff")
	}
	switch rec.Code {
	case http.StatusOK:
		body := rec.Body.String()
		if !strings.Contains(body, `<script type="module"`) || strings.Contains(body, "<script>") {
			t.Errorf("the page: %s", body)
		}
	case http.StatusNotFound:
		if !strings.Contains(rec.Body.String(), "make build") {
			t.Errorf("an unbuilt console says %q", rec.Body.String())
		}
	default:
		t.Fatalf("GET /: %d", rec.Code)
	}
}
