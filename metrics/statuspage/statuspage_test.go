package statuspage_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/metrics/statuspage"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

func newPool(t *testing.T, params string) (*pgxlanes.Pool, string) {
	t.Helper()
	dsn := pgserver.NewDatabase(t)
	if strings.Contains(dsn, "?") {
		dsn += "&" + params
	} else {
		dsn += "?" + params
	}
	cfg, err := pgxlanes.ParseConfig(dsn)
	require.NoError(t, err)
	password := pgserver.Password(&cfg.ConnConfig.Config)
	p, err := pgxlanes.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p, password
}

func get(t *testing.T, h http.Handler, method, target string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	resp := w.Result()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// TestRequests: read-only, the format chosen by ?format or Accept, bad input named, and a page
// that answers on a pool nobody has used yet.
func TestRequests(t *testing.T) {
	p, _ := newPool(t, "pool_max_conns=4")
	h := statuspage.New(p, statuspage.WithName("orders"), statuspage.WithLockWaits(false))

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		resp, _ := get(t, h, m, "/", nil)
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, m)
		assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	}
	for _, tc := range []struct {
		target, accept, want string
	}{
		{"/", "", "text/html; charset=utf-8"},
		{"/", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "text/html; charset=utf-8"},
		{"/", "application/json", "application/json; charset=utf-8"},
		{"/?format=json", "text/html", "application/json; charset=utf-8"},
		{"/?format=html", "application/json", "text/html; charset=utf-8"},
	} {
		resp, body := get(t, h, http.MethodGet, tc.target, map[string]string{"Accept": tc.accept})
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s %s", tc.target, tc.accept)
		assert.Equal(t, tc.want, resp.Header.Get("Content-Type"), "%s %s", tc.target, tc.accept)
		assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
		if strings.HasPrefix(tc.want, "text/html") {
			assert.Contains(t, body, "<title>orders: pgxlanes status</title>")
			assert.Contains(t, body, `http-equiv="refresh" content="5"`)
			assert.Contains(t, body, "lock lookup off")
		} else {
			assert.True(t, json.Valid([]byte(body)), body)
		}
	}
	resp, body := get(t, h, http.MethodGet, "/?format=xml", nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, "format")
	resp, body = get(t, h, http.MethodGet, "/?refresh=-1", nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, "refresh")
	_, body = get(t, h, http.MethodGet, "/?refresh=0", nil)
	assert.NotContains(t, body, `http-equiv="refresh"`)
}

// TestBoundedAndEscaped: 25 held connections list the 20 held longest, with the count of all; a
// tag is escaped; neither format carries the password; a page costs no goroutine.
func TestBoundedAndEscaped(t *testing.T) {
	p, password := newPool(t, "pool_max_conns=40")
	require.NotEmpty(t, password)
	h := statuspage.New(p)
	ctx := pgxlanes.WithTag(context.Background(), `<script>alert(1)</script>`)
	for range 25 {
		c, err := p.Acquire(ctx)
		require.NoError(t, err)
		t.Cleanup(c.Release)
	}
	require.NoError(t, p.Ping(context.Background())) // the guard session opens lazily: open it before counting goroutines
	_, _ = get(t, h, http.MethodGet, "/", nil)
	leak := goleak.IgnoreCurrent()

	_, html := get(t, h, http.MethodGet, "/", nil)
	assert.Equal(t, 20, strings.Count(html, `<tr class="lease`), "the leases listed")
	assert.Contains(t, html, "25 Tx and Long leases held now; the 20 oldest")
	assert.NotContains(t, html, "<script>")
	assert.Contains(t, html, "&lt;script&gt;")
	assert.NotContains(t, html, password)
	assert.Contains(t, html, "nobody waits for a lock")

	_, body := get(t, h, http.MethodGet, "/?format=json", nil)
	assert.NotContains(t, body, password)
	var js struct {
		Leases     []json.RawMessage `json:"leases"`
		HeldLeases int               `json:"held_leases"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &js))
	assert.Len(t, js.Leases, pgxlanes.StatusMaxLeases)
	assert.Equal(t, 25, js.HeldLeases)
	goleak.VerifyNone(t, leak)
}
