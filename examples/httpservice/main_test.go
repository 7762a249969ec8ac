package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/internal/promtest"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

// service runs the service in-process on a fresh database with the extra DSN parameters and
// flags, and returns its base URL and a function that stops it and returns run's error.
func service(t *testing.T, params string, flags ...string) (base string, stop func() error) {
	t.Helper()
	dsn := pgserver.NewDatabase(t)
	if params != "" {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal("harness DSN is not a URL")
		}
		q := u.Query()
		for _, p := range strings.Split(params, "&") {
			k, v, _ := strings.Cut(p, "=")
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	args := append([]string{"-addr", "127.0.0.1:0", "-dsn", dsn}, flags...)
	go func() { done <- run(ctx, args, func(addr string) { addrs <- addr }) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = errors.New("run did not return within 30s of the cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case addr := <-addrs:
		return "http://" + addr, stop
	case err := <-done:
		t.Fatalf("run returned before it was ready: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the service was not ready within 60s")
	}
	return "", nil
}

var client = &http.Client{Timeout: 20 * time.Second}

// call makes a request and returns the status and body.
func call(t *testing.T, method, u string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, u, err)
	}
	return resp.StatusCode, string(body)
}

// scrape fetches /metrics and parses it.
func scrape(t *testing.T, base string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	status, body := call(t, http.MethodGet, base+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return mfs, body
}

func labels(kv ...string) map[string]string {
	m := map[string]string{"pool": "app"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func TestService(t *testing.T) {
	t.Parallel()
	const delay = 800 * time.Millisecond
	base, stop := service(t, "pool_max_conns=6&lane_long_max_conns=1&lane_long_acquire_timeout=50ms",
		"-report-delay", delay.String())

	const lookups, orders, reports = 10, 3, 1
	for i := 1; i <= lookups; i++ {
		status, body := call(t, http.MethodGet, fmt.Sprintf("%s/items/%d", base, i))
		var it item
		if status != http.StatusOK || json.Unmarshal([]byte(body), &it) != nil || it.ID != i {
			t.Fatalf("GET /items/%d: %d %s", i, status, body)
		}
	}
	if status, _ := call(t, http.MethodGet, base+"/items/100000"); status != http.StatusNotFound {
		t.Errorf("GET /items/100000: %d, want 404", status)
	}
	for range orders {
		if status, body := call(t, http.MethodPost, base+"/orders?item=7"); status != http.StatusCreated {
			t.Fatalf("POST /orders: %d %s", status, body)
		}
	}
	for range reports {
		status, body := call(t, http.MethodGet, base+"/report")
		if status != http.StatusOK || !strings.Contains(body, `"orders":3`) {
			t.Fatalf("GET /report: %d %s", status, body)
		}
	}
	// A second report while one runs: the Long lane has one connection and a 50ms acquire
	// timeout, so it gets 503 while the first one finishes with 200.
	first := make(chan int, 1)
	go func() {
		resp, err := client.Get(base + "/report")
		if err != nil {
			first <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	waitLongInUse(t, base)
	if status, body := call(t, http.MethodGet, base+"/report"); status != http.StatusServiceUnavailable {
		t.Errorf("a report while the Long lane's only connection is taken: %d %s, want 503", status, body)
	}
	if status := <-first; status != http.StatusOK {
		t.Errorf("the first report: %d, want 200", status)
	}

	mfs, body := scrape(t, base)
	var all, nonZero []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "pgxlanes_") {
			all = append(all, l)
			if !strings.HasSuffix(l, " 0") && !strings.Contains(l, "_bucket{") {
				nonZero = append(nonZero, l)
			}
		}
	}
	t.Logf("/metrics has %d pgxlanes_ lines; those not 0, buckets left out:\n%s", len(all), strings.Join(nonZero, "\n"))

	counter := func(name string, kv ...string) float64 {
		return promtest.Find(t, mfs, name, labels(kv...)).GetCounter().GetValue()
	}
	gauge := func(name string, kv ...string) float64 {
		return promtest.Find(t, mfs, name, labels(kv...)).GetGauge().GetValue()
	}
	hist := func(name string, kv ...string) (uint64, float64) {
		h := promtest.Find(t, mfs, name, labels(kv...)).GetHistogram()
		return h.GetSampleCount(), h.GetSampleSum()
	}
	for _, c := range []struct {
		name string
		kv   []string
		want float64
	}{
		{"pgxlanes_acquires_total", []string{"lane", "short"}, lookups + 1},
		{"pgxlanes_acquires_total", []string{"lane", "tx"}, orders + 1}, // and the schema setup's transaction
		{"pgxlanes_acquires_total", []string{"lane", "long"}, reports + 1},
		{"pgxlanes_acquire_timeouts_total", []string{"lane", "long"}, 1},
		{"pgxlanes_acquire_timeouts_total", []string{"lane", "short"}, 0},
		{"pgxlanes_acquire_rejections_total", []string{"lane", "long"}, 0},
		{"pgxlanes_budget_violations_total", []string{"lane", "tx", "action", "terminate"}, 0},
	} {
		if got := counter(c.name, c.kv...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.kv, got, c.want)
		}
	}
	if n, _ := hist("pgxlanes_acquire_wait_seconds", "lane", "short", "tag", "item"); n != lookups+1 {
		t.Errorf("acquire wait{short,item}: %d samples, want %d", n, lookups+1)
	}
	if n, _ := hist("pgxlanes_acquire_wait_seconds", "lane", "short", "tag", "report"); n != 0 {
		t.Errorf("acquire wait{short,report}: %d samples, want 0", n)
	}
	if n, _ := hist("pgxlanes_acquire_wait_seconds", "lane", "long", "tag", "report"); n != reports+2 {
		t.Errorf("acquire wait{long,report}: %d samples, want %d (every attempt, the timeout too)", n, reports+2)
	}
	if n, sum := hist("pgxlanes_hold_seconds", "lane", "long", "tag", "report"); n != reports+1 || sum < float64(reports+1)*delay.Seconds() {
		t.Errorf("hold{long,report}: %d samples, sum %.3fs; want %d, at least %.3fs", n, sum, reports+1, float64(reports+1)*delay.Seconds())
	}
	if n, _ := hist("pgxlanes_acquire_wait_seconds", "lane", "tx", "tag", "order"); n != orders {
		t.Errorf("acquire wait{tx,order}: %d samples, want %d (counts per tag are the histograms')", n, orders)
	}
	if n, _ := hist("pgxlanes_hold_seconds", "lane", "tx", "tag", "order"); n != orders {
		t.Errorf("hold{tx,order}: %d samples, want %d", n, orders)
	}
	for _, l := range []string{"short", "tx", "long"} {
		if got := gauge("pgxlanes_lane_in_use_connections", "lane", l); got != 0 {
			t.Errorf("in use{%s} between requests = %v, want 0", l, got)
		}
	}
	if got := gauge("pgxlanes_lane_max_connections", "lane", "long"); got != 1 {
		t.Errorf("max connections{long} = %v, want 1", got)
	}
	if got := gauge("pgxlanes_pool_max_connections"); got != 6 {
		t.Errorf("pool max connections = %v, want 6", got)
	}
	if got := gauge("pgxlanes_pool_open_connections"); got < 1 || got > 6 {
		t.Errorf("open connections = %v, want 1 to 6", got)
	}
	if mfs["go_goroutines"] == nil {
		t.Error("/metrics has no go_goroutines: the Go collector is missing")
	}
	// The status page is mounted, and its JSON names the three lanes.
	if status, body := call(t, http.MethodGet, base+"/debug/pgxlanes?format=json"); status != http.StatusOK ||
		!strings.Contains(body, `"lane": "short"`) || !strings.Contains(body, `"lane": "long"`) {
		t.Errorf("GET /debug/pgxlanes?format=json: %d\n%s", status, body)
	}

	if err := stop(); err != nil {
		t.Errorf("run after the cancel: %v", err)
	}
}

// TestGracefulShutdown cancels the service's context while a report runs: the report must
// finish with 200 and run must return nil.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	base, stop := service(t, "", "-report-delay", "1500ms")
	result := make(chan int, 1)
	go func() {
		resp, err := client.Get(base + "/report")
		if err != nil {
			result <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		result <- resp.StatusCode
	}()
	waitLongInUse(t, base)
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
	if status := <-result; status != http.StatusOK {
		t.Errorf("the in-flight report got %d, want 200", status)
	}
	if _, err := client.Get(base + "/items/1"); err == nil {
		t.Error("the service still answers after shutdown")
	}
}

// waitLongInUse scrapes /metrics until a report holds the Long lane's connection.
func waitLongInUse(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mfs, _ := scrape(t, base)
		if promtest.Find(t, mfs, "pgxlanes_lane_in_use_connections", labels("lane", "long")).GetGauge().GetValue() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no report held a Long connection within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":8080", "[::]:0", "192.0.2.1:80", "localhost"} {
		err := run(context.Background(), []string{"-addr", addr, "-dsn", "postgres://nobody@127.0.0.1:1/x"}, nil)
		if err == nil || !strings.Contains(err.Error(), "-addr") {
			t.Errorf("-addr %s: err = %v, want a refusal", addr, err)
		}
	}
}
