// Command httplanes shows the reserve package outside a database: an HTTP client whose backend
// allows 4 concurrent requests serves fast lookups (about 1 ms) and slow exports (1 s). With one
// FIFO semaphore of 4, as an http.Transport's MaxConnsPerHost or a worker pool gives, a burst of
// exports fills every slot and each lookup waits for an export to finish. With reserve, lookups
// have a lane of their own with one reserved slot; exports may use the other three, never the
// lookups' reserve, and lookups may borrow idle export slots.
//
//	cd examples && go run ./httplanes
//
// It runs two phases of about 3 s on a loopback test server and prints the lookups' latency with
// each limiter. The verdict holds when the lanes' p99 is far below one export's duration and the
// FIFO's is near it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// limiter is what each contender puts in front of the HTTP client.
type limiter interface {
	acquire(ctx context.Context, slow bool) (release func(), err error)
}

// fifo is one semaphore for all requests: the usual bulkhead, without lanes.
type fifo struct{ s *semaphore.Weighted }

func (f fifo) acquire(ctx context.Context, _ bool) (func(), error) {
	if err := f.s.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	return func() { f.s.Release(1) }, nil
}

// lanes gives lookups a bounded lane with one reserved slot, and exports an unbounded one.
type lanes struct{ fast, slow reserve.Lane }

func newLanes(size int) (lanes, error) {
	p, err := reserve.New(reserve.Config{Size: size, Lanes: []reserve.LaneConfig{
		// A lookup's hold time is bounded (a client timeout), so the lane may borrow idle slots.
		{Name: "fast", Reserved: 1, Bounded: true, AcquireTimeout: time.Second},
		// An export's is not: it never takes the fast lane's reserve.
		{Name: "slow", AcquireTimeout: 30 * time.Second},
	}})
	if err != nil {
		return lanes{}, err
	}
	fast, _ := p.Lane("fast")
	slow, _ := p.Lane("slow")
	return lanes{fast, slow}, nil
}

func (l lanes) acquire(ctx context.Context, slow bool) (func(), error) {
	lane := l.fast
	if slow {
		lane = l.slow
	}
	s, err := lane.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return s.Release, nil
}

func main() {
	size := flag.Int("size", 4, "concurrent requests the backend allows")
	exportTime := flag.Duration("export", time.Second, "how long one export takes")
	phase := flag.Duration("phase", 3*time.Second, "how long each contender runs")
	exporters := flag.Int("exporters", 8, "clients issuing exports back to back")
	lookupEvery := flag.Duration("lookup-every", 5*time.Millisecond, "a lookup is due this often")
	flag.Parse()

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := time.Millisecond
		if r.URL.Path == "/export" {
			d = *exportTime
		}
		time.Sleep(d)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: time.Minute}

	ln, err := newLanes(*size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	contenders := []struct {
		name string
		lim  limiter
	}{
		{"one FIFO semaphore", fifo{semaphore.NewWeighted(int64(*size))}},
		{"reserve lanes", ln},
	}
	fmt.Printf("backend: %d concurrent requests; %d clients export back to back (%v each); a lookup due every %v\n\n",
		*size, *exporters, *exportTime, *lookupEvery)
	fmt.Printf("%-20s %10s %10s %10s %9s %8s\n", "limiter", "p50", "p99", "max", "lookups", "exports")
	var p99s []time.Duration
	for _, c := range contenders {
		r := run(c.lim, client, srv.URL, *phase, *exporters, *lookupEvery)
		fmt.Printf("%-20s %10s %10s %10s %9d %8d\n", c.name, ms(r.q(0.5)), ms(r.q(0.99)), ms(r.q(1)), len(r.lat), r.exports)
		p99s = append(p99s, r.q(0.99))
	}
	fmt.Println()
	if p99s[1]*10 < *exportTime && p99s[0] > *exportTime/2 {
		fmt.Printf("verdict: with lanes a lookup never queued behind an export (p99 %s against %s with one FIFO)\n", ms(p99s[1]), ms(p99s[0]))
		return
	}
	fmt.Printf("verdict: NOT SHOWN: lanes p99 %s, FIFO p99 %s, one export %v\n", ms(p99s[1]), ms(p99s[0]), *exportTime)
	os.Exit(1)
}

type result struct {
	lat     []time.Duration
	exports int
}

func (r result) q(f float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(f*float64(len(s))))]
}

// run drives one contender for d: exporters back to back, and lookups issued open loop, each
// lookup's latency counted from when it was due, so that waiting for a slot counts.
func run(lim limiter, client *http.Client, url string, d time.Duration, exporters int, every time.Duration) result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var res result
	var wg sync.WaitGroup
	call := func(ctx context.Context, slow bool, path string) error {
		release, err := lim.acquire(ctx, slow)
		if err != nil {
			return err
		}
		defer release()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	for range exporters {
		wg.Go(func() {
			for ctx.Err() == nil {
				if call(ctx, true, "/export") == nil {
					mu.Lock()
					res.exports++
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // the exports take every slot they may
	tick := time.NewTicker(every)
	defer tick.Stop()
	for due := range tick.C {
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			// A lookup gets its own deadline: it is not cut short by the end of the phase.
			lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer lcancel()
			if call(lctx, false, "/lookup") == nil {
				mu.Lock()
				res.lat = append(res.lat, time.Since(due))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
