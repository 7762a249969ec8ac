// Package statuspage serves a live status page of a pgxlanes pool for the engineer on call: the
// question during an incident is "who holds the connections, who waits, who blocks whom", which
// PgBouncer answers with SHOW POOLS and Vitess with its debug pages.
//
// Mount it at a path of your choice, behind whatever guards your other debug endpoints:
//
//	mux.Handle("/debug/pgxlanes", statuspage.New(pool, statuspage.WithName("orders")))
//
// It shows, as HTML or as JSON (?format=json, or Accept: application/json):
//
//   - each lane's connections in use, borrowed, being cleaned and waiting, and the oldest wait,
//     against its reserve, its cap and its acquire timeout;
//   - the Tx and Long leases held longest, with lane, tag, kind, age against budget, backend PID
//     and call site (with Config.CaptureCallSites);
//   - who blocks whom: the sessions of the pool's database waiting for a lock and the sessions
//     holding it, the pool's own leases named (Pool.LockWaits);
//   - the statements the learner moved out of Short, and the recent budget warnings and actions.
//
// The page is read-only (GET and HEAD only) and bounded (pgxlanes.StatusMaxLeases and friends).
// It shows no SQL parameter values, no statement text but the learned statements' (as the
// application wrote them, truncated), and nothing of the connection string. It costs nothing
// while nobody looks: it keeps no goroutine and no observer; a request takes one Pool.Status
// (memory only) and at most one lock lookup a second over the pool's guard session.
package statuspage

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Option configures the handler.
type Option func(*handler)

// WithName names the pool on the page (a service may have several). The default is "pgxlanes".
func WithName(name string) Option { return func(h *handler) { h.name = name } }

// WithRefresh sets how often the HTML page reloads itself; 0 turns it off. The default is 5 s.
// A request can override it with ?refresh=SECONDS (0 to stop).
func WithRefresh(d time.Duration) Option { return func(h *handler) { h.refresh = d } }

// WithLockWaits turns the lock lookup (Pool.LockWaits) on or off. It is on by default.
func WithLockWaits(on bool) Option { return func(h *handler) { h.lockWaits = on } }

// New returns an http.Handler that serves pool's status page.
func New(pool *pgxlanes.Pool, opts ...Option) http.Handler {
	h := &handler{pool: pool, name: "pgxlanes", refresh: 5 * time.Second, lockWaits: true}
	for _, o := range opts {
		o(h)
	}
	cfg := pool.Config() // immutable after New: read once, not per request
	for _, l := range pgxlanes.Lanes() {
		h.acquireTimeout[l] = cfg.Lane(l).AcquireTimeout
	}
	return h
}

type handler struct {
	pool           *pgxlanes.Pool
	name           string
	refresh        time.Duration
	lockWaits      bool
	acquireTimeout [3]time.Duration // by lane
}

// lockTimeout bounds a request's lock lookup: the page answers without it rather than wait.
const lockTimeout = 2 * time.Second

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "statuspage: read-only: GET or HEAD", http.StatusMethodNotAllowed)
		return
	}
	asJSON, err := wantsJSON(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	refresh := h.refresh
	if v := r.URL.Query().Get("refresh"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 3600 {
			http.Error(w, "statuspage: refresh: want whole seconds from 0 to 3600", http.StatusBadRequest)
			return
		}
		refresh = time.Duration(n) * time.Second
	}

	pg := h.build(r.Context())
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	if asJSON {
		hdr.Set("Content-Type", "application/json; charset=utf-8")
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		_ = enc.Encode(pg)
		return
	}
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	// Inline styles only: no script, no other origin.
	hdr.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	pg.RefreshS = int(refresh / time.Second)
	if err := pageTemplate.Execute(w, pg); err != nil {
		// Headers are gone; the page is cut short, which the reader sees.
		fmt.Fprintf(w, "\n<p>statuspage: %s</p>\n", htmlEscape(err.Error()))
	}
}

// wantsJSON reads ?format= first, then the Accept header: JSON when it names application/json
// before (or without) text/html.
func wantsJSON(r *http.Request) (bool, error) {
	switch f := r.URL.Query().Get("format"); f {
	case "json":
		return true, nil
	case "html":
		return false, nil
	case "":
	default:
		return false, fmt.Errorf("statuspage: format: want json or html, got %q", truncate(f, 20))
	}
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "application/json":
			return true, nil
		case "text/html":
			return false, nil
		}
	}
	return false, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;").Replace(s)
}

// build takes the snapshot and, if on, the lock lookup, bounded by lockTimeout.
func (h *handler) build(ctx context.Context) *page {
	st := h.pool.Status()
	pg := &page{Name: h.name, Taken: st.Taken.UTC().Format(time.RFC3339), HeldLeases: st.HeldLeases,
		ActionsTotal: st.ActionsTotal}
	for _, l := range st.Lanes {
		pg.Lanes = append(pg.Lanes, newLaneView(l, h.acquireTimeout[l.Lane]))
	}
	for _, l := range st.Leases {
		pg.Leases = append(pg.Leases, newLeaseView(l))
	}
	ls := st.Learning
	pg.Learning = learningView{On: ls.Threshold > 0, ThresholdMS: ms(ls.Threshold), Demoted: ls.Demoted,
		Demotions: ls.Demotions, Promotions: ls.Promotions, Tracked: ls.Tracked}
	for _, s := range st.Statements {
		pg.Statements = append(pg.Statements, stmtView{At: s.At.UTC().Format(time.RFC3339), Ago: ago(st.Taken, s.At),
			SQL: s.SQL, Demoted: s.Demoted})
	}
	for _, a := range st.Actions {
		what := a.Action.String()
		if a.Warning {
			what = "warning"
		}
		pg.Actions = append(pg.Actions, actionView{At: a.At.UTC().Format(time.RFC3339), Ago: ago(st.Taken, a.At),
			Lane: a.Lane.String(), Tag: a.Tag, Action: what, PID: a.PID, BudgetMS: ms(a.Budget), ElapsedMS: ms(a.Elapsed),
			CallSite: a.CallSite, Err: a.Err})
	}
	pg.MoreActions = st.ActionsTotal > int64(len(pg.Actions))
	if h.lockWaits {
		pg.LockLookup = true
		lctx, cancel := context.WithTimeout(ctx, lockTimeout)
		waits, err := h.pool.LockWaits(lctx)
		cancel()
		if err != nil {
			pg.LockWaitsError = err.Error()
		}
		for _, w := range waits {
			v := lockWaitView{Waiter: w.Waiter, WaitedMS: ms(w.Waited), Holder: w.Holder, HolderState: w.HolderState,
				HolderXactAgeMS: ms(w.HolderXactAge)}
			if w.WaiterLease != nil {
				lv := newLeaseView(*w.WaiterLease)
				v.WaiterLease = &lv
			}
			if w.HolderLease != nil {
				lv := newLeaseView(*w.HolderLease)
				v.HolderLease = &lv
			}
			pg.LockWaits = append(pg.LockWaits, v)
		}
	}
	return pg
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func ago(now, t time.Time) string { return fmtDur(now.Sub(t)) + " ago" }

// fmtDur prints a duration for a person: 850µs, 12.3ms, 4.56s, 3m12s.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
	case d < time.Minute:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return d.Round(time.Second).String()
	}
}
