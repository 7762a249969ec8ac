package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
)

// The example's claim at a reduced size: with lanes, lookups do not queue behind exports; with one
// FIFO semaphore they do. Generous bounds: the two differ by two orders of magnitude.
func TestLanesKeepLookupsOutOfTheExportQueue(t *testing.T) {
	const export = 500 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/export" {
			time.Sleep(export)
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	ln, err := newLanes(4)
	if err != nil {
		t.Fatal(err)
	}
	withLanes := run(ln, client, srv.URL, 1500*time.Millisecond, 8, 10*time.Millisecond)
	withFIFO := run(fifo{semaphore.NewWeighted(4)}, client, srv.URL, 1500*time.Millisecond, 8, 10*time.Millisecond)
	t.Logf("lookup p99: lanes %v, FIFO %v", withLanes.q(0.99), withFIFO.q(0.99))
	if len(withLanes.lat) == 0 || withLanes.exports == 0 {
		t.Fatalf("lanes served %d lookups and %d exports", len(withLanes.lat), withLanes.exports)
	}
	if got := withLanes.q(0.99); got > export/3 {
		t.Errorf("with lanes a lookup's p99 was %v, near an export's %v: lookups queued behind exports", got, export)
	}
	if got := withFIFO.q(0.99); got < export/2 {
		t.Errorf("with one FIFO the lookups' p99 was %v: the test did not reproduce head-of-line blocking", got)
	}
}
