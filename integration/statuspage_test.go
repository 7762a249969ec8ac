package integration

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/metrics/statuspage"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// EnvStatusPageScreenshot names a PNG file TestStatusPageInBrowser writes the page to
// (docs/statuspage.png is made with it).
const EnvStatusPageScreenshot = "PGXLANES_STATUSPAGE_SCREENSHOT"

// TestStatusPageInBrowser loads the status page in headless Chromium against a pool under a
// storm and checks what the browser rendered: a transaction sits on a row lock, three more wait
// for it, four more fill the Tx lane and two queue behind them, an unannotated slow statement is
// learned and moved to Long, every transaction goes over its budget and is flagged, and lookups
// keep running on Short. The page must show each of these, name the holder of the lock by its
// tag and call site, and carry no password.
func TestStatusPageInBrowser(t *testing.T) {
	browser := findChromium(t)
	dsn := newDB(t, 100)
	cfg, err := pgxlanes.ParseConfig(withParams(dsn,
		"pool_max_conns=8&lane_tx_budget=1s&lane_tx_over_budget=flag&lane_tx_acquire_timeout=60s&lane_tx_lock_timeout=60s"+
			"&lane_tx_statement_timeout=60s"+
			"&lane_short_slow_threshold=200ms"))
	require.NoError(t, err)
	cfg.CaptureCallSites = true
	password := pgserver.Password(&cfg.ConnConfig.Config) // the page must not show it
	p, err := pgxlanes.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	errs := make(chan error, 64)
	report := func(err error) {
		if err != nil && ctx.Err() == nil {
			select {
			case errs <- err:
			default:
			}
		}
	}

	// holdTx begins a transaction tagged tag, runs sql in it and keeps it open until the storm
	// ends; done is closed once sql has run.
	holdTx := func(tag, sql string, done chan<- struct{}) {
		wg.Go(func() {
			tx, err := p.Begin(pgxlanes.WithTag(ctx, tag))
			if err != nil {
				report(err)
				return
			}
			defer tx.Rollback(context.Background())
			if sql != "" {
				if _, err := tx.Exec(ctx, sql); err != nil {
					report(err)
					return
				}
			}
			if done != nil {
				close(done)
			}
			<-ctx.Done()
		})
	}
	locked := make(chan struct{})
	holdTx("holder", "select v from items where id = 1 for update", locked)
	select {
	case <-locked:
	case err := <-errs:
		t.Fatalf("the holder: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not get its row lock in 10 s")
	}
	for range 3 {
		holdTx("waiter", "select v from items where id = 1 for update", nil)
	}
	pgserver.Eventually(t, 10*time.Second, "the waiters have their connections", func() bool { return p.Stat().Lane(pgxlanes.Tx).InUse == 4 })
	for range 4 {
		holdTx("batch", "", nil)
	}
	// An unannotated slow statement: learned as slow within about the threshold, then moved to
	// Long's capacity. One client, so that Short keeps a connection for the lookups and the
	// learner has their runs to compare it with (relative rule, issue 23).
	for range 1 {
		wg.Go(func() {
			for ctx.Err() == nil {
				var x any
				report(ignoreTimeouts(p.QueryRow(ctx, "select pg_sleep(0.4)").Scan(&x)))
			}
		})
	}
	// Lookups on Short.
	wg.Go(func() {
		for ctx.Err() == nil {
			var v int
			report(ignoreTimeouts(p.QueryRow(ctx, "select v from items where id = $1", 42).Scan(&v)))
			time.Sleep(5 * time.Millisecond)
		}
	})
	pgserver.Eventually(t, 20*time.Second, "the storm: the Tx lane full with callers queued, a statement demoted, a transaction flagged",
		func() bool {
			st := p.Status()
			tx := st.Lanes[pgxlanes.Tx]
			return tx.InUse == tx.MaxConns && tx.Waiting > 0 && st.Learning.Demoted > 0 && len(st.Actions) > 0
		})

	srv := httptest.NewServer(statuspage.New(p, statuspage.WithName("orders")))
	t.Cleanup(srv.Close)

	dom := chromium(t, browser, "--dump-dom", srv.URL+"/?refresh=0")
	if path := os.Getenv(EnvStatusPageScreenshot); path != "" {
		abs, err := filepath.Abs(path)
		require.NoError(t, err)
		chromium(t, browser, "--screenshot="+abs, "--window-size=1280,1900", "--hide-scrollbars", srv.URL+"/?refresh=0")
		t.Logf("screenshot: %s", abs)
	}
	select {
	case err := <-errs:
		t.Fatalf("the storm: %v", err)
	default:
	}

	text := visibleText(dom)
	t.Logf("the page as rendered (text):\n%s", text)
	assert.Contains(t, dom, "<title>orders: pgxlanes status</title>")
	assert.NotContains(t, dom, password, "the page shows the password")

	// Lanes: Tx full to its cap, callers waiting with their oldest wait, Short's lookups.
	txRow := rowOf(t, dom, `data-lane="tx"`)
	tx := p.Stat().Lane(pgxlanes.Tx)
	assert.Regexp(t, `class="n in-use">`+itoa(tx.MaxConns)+`<`, txRow, "Tx in use at its cap")
	assert.Regexp(t, `class="n waiting">[1-9]`, txRow, "callers waiting in Tx")
	assert.Regexp(t, `[0-9.]+(ms|s)</td>`, txRow, "the oldest wait")

	// The leases held longest: the holder first, over budget and flagged, with its call site.
	leases := section(t, dom, `id="leases"`)
	first := rowOf(t, leases, `class="lease`)
	assert.Contains(t, first, "<td>holder</td>")
	assert.Contains(t, first, "transaction")
	assert.Contains(t, first, "flagged")
	assert.Contains(t, first, "statuspage_test.go:", "the holder's call site")
	assert.Contains(t, first, `class="lease bad"`, "over its budget")
	assert.GreaterOrEqual(t, strings.Count(leases, `class="lease`), tx.MaxConns, "every transaction held")

	// Who blocks whom: the three waiters, named by tag; the holder blocks the first of them (the
	// others queue behind it for the row: PostgreSQL names either as their blocker).
	locks := section(t, dom, `id="locks"`)
	rows := strings.Count(locks, `class="lockwait"`)
	assert.GreaterOrEqual(t, rows, 3, "a row per waiter and blocker")
	assert.Equal(t, rows, strings.Count(locks, `<td class="who">tx · waiter · transaction</td>`), "every waiter named by its lease")
	assert.Contains(t, locks, "tx · holder · transaction, held", "the holder named by its lease")
	assert.Contains(t, locks, "idle in transaction", "the holder's state")

	// The learner moved the slow statement; the budget actions flagged the transactions.
	stmts := section(t, dom, `id="statements"`)
	assert.Contains(t, stmts, "to Long")
	assert.Contains(t, stmts, "select pg_sleep(?)", "the learned statement, its literals folded: the page shows no values")
	actions := section(t, dom, `id="actions"`)
	assert.Contains(t, actions, "<b>flag</b>")
	assert.Contains(t, actions, "<td>holder</td>")

	// The same as JSON, by ?format=json and by Accept.
	for _, req := range []func() (*http.Response, error){
		func() (*http.Response, error) { return http.Get(srv.URL + "/?format=json") },
		func() (*http.Response, error) {
			r, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
			r.Header.Set("Accept", "application/json")
			return http.DefaultClient.Do(r)
		},
	} {
		resp, err := req()
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, "application/json; charset=utf-8", resp.Header.Get("Content-Type"))
		assert.NotContains(t, string(body), password)
		var js struct {
			Lanes []struct {
				Lane    string `json:"lane"`
				InUse   int    `json:"in_use"`
				Waiting int    `json:"waiting"`
			} `json:"lanes"`
			Leases []struct {
				Tag      string  `json:"tag"`
				AgeMS    float64 `json:"age_ms"`
				BudgetMS float64 `json:"budget_ms"`
				CallSite string  `json:"call_site"`
			} `json:"leases"`
			LockWaits []struct {
				WaiterLease *struct {
					Tag string `json:"tag"`
				} `json:"waiter_lease"`
				HolderLease *struct {
					Tag string `json:"tag"`
				} `json:"holder_lease"`
			} `json:"lock_waits"`
			Statements []struct {
				SQL     string `json:"sql"`
				Demoted bool   `json:"demoted"`
			} `json:"statements"`
			Actions []struct {
				Action string `json:"action"`
			} `json:"budget_actions"`
		}
		require.NoError(t, json.Unmarshal(body, &js), "%s", body)
		require.Len(t, js.Lanes, 3)
		assert.Equal(t, "tx", js.Lanes[1].Lane)
		assert.Equal(t, tx.MaxConns, js.Lanes[1].InUse)
		require.NotEmpty(t, js.Leases)
		assert.Equal(t, "holder", js.Leases[0].Tag)
		assert.Greater(t, js.Leases[0].AgeMS, js.Leases[0].BudgetMS)
		require.GreaterOrEqual(t, len(js.LockWaits), 3)
		holders := map[string]int{}
		for _, w := range js.LockWaits {
			require.NotNil(t, w.WaiterLease)
			assert.Equal(t, "waiter", w.WaiterLease.Tag)
			require.NotNil(t, w.HolderLease)
			holders[w.HolderLease.Tag]++
		}
		assert.Positive(t, holders["holder"], "the holder blocks a waiter")
		require.NotEmpty(t, js.Statements)
		assert.True(t, js.Statements[len(js.Statements)-1].Demoted)
		require.NotEmpty(t, js.Actions)
		assert.Equal(t, "flag", js.Actions[len(js.Actions)-1].Action)
	}

	// Read-only.
	resp, err := http.Post(srv.URL+"/", "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	stop()
	wg.Wait()
	lanesIdle(t, p, "after the storm")
	select {
	case err := <-errs:
		t.Fatalf("the storm: %v", err)
	default:
	}
}

// ignoreTimeouts drops the errors a storm's calls may meet by design: Short's acquire timeout
// and full queue while the slow statement is still being learned.
func ignoreTimeouts(err error) error {
	if errors.Is(err, pgxlanes.ErrAcquireTimeout) || errors.Is(err, pgxlanes.ErrLaneFull) ||
		errors.Is(err, context.Canceled) || errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// findChromium returns the headless browser's path. .ci/run installs Debian's chromium; without
// one the test skips, except in CI, where it fails.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on PATH: apt-get install -y chromium (.ci/run installs it)")
	}
	t.Skip("no chromium on PATH (apt-get install -y chromium): the status page is not loaded in a browser")
	return ""
}

// chromium runs headless Chromium with args and returns its standard output. It runs in a
// process group of its own, killed when it overruns.
func chromium(t *testing.T, browser string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, browser, all...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

var (
	tagRE   = regexp.MustCompile(`(?s)<style.*?</style>|<[^>]*>`)
	blankRE = regexp.MustCompile(`[ \t]*\n[ \t\n]*`)
)

// visibleText is the page's text without tags, for the log.
func visibleText(dom string) string {
	return strings.TrimSpace(blankRE.ReplaceAllString(tagRE.ReplaceAllString(dom, " "), "\n"))
}

// section returns the table that has attribute attr, from its start to its end.
func section(t *testing.T, dom, attr string) string {
	t.Helper()
	i := strings.Index(dom, attr)
	if i < 0 {
		t.Fatalf("the page has no table %s", attr)
	}
	j := strings.Index(dom[i:], "</table>")
	require.GreaterOrEqual(t, j, 0)
	return dom[i : i+j]
}

// rowOf returns the first table row of s that has attribute attr.
func rowOf(t *testing.T, s, attr string) string {
	t.Helper()
	i := strings.Index(s, attr)
	if i < 0 {
		t.Fatalf("no row with %s in:\n%s", attr, s)
	}
	j := strings.Index(s[i:], "</tr>")
	require.GreaterOrEqual(t, j, 0)
	return s[i : i+j]
}
