package integration

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// BenchmarkHotPathConnHeap reports the heap each idle connection costs (B/conn, issue 22): the
// heap after a pool of 100 connections opened and served 2,000 queries from 100 clients, and went
// idle, minus the heap before it opened (or after it closed, if more), over 100. pgxlanes beside
// plain pgxpool. Both include pgx's two statement caches per connection (about 41 KB: maps made
// for 512 entries) and pgproto3's 8 KiB read buffer.
func BenchmarkHotPathConnHeap(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	const conns, clients, queries = 100, 100, 20
	ctx := context.Background()
	for _, impl := range []benchImpl{
		{"pgxpool", sized(conns, openPgxpoolDSN)},
		{"pgxlanes", sized(conns, openLanesDSN(pgxlanes.Short))},
	} {
		b.Run("Impl="+impl.name, func(b *testing.B) {
			var perConn float64
			for b.Loop() {
				before := settledHeap()
				p := impl.open(b, dsn)
				deadline := time.Now().Add(30 * time.Second)
				for p.totalConns() < conns {
					if time.Now().After(deadline) {
						b.Fatalf("only %d of %d connections open after 30s", p.totalConns(), conns)
					}
					time.Sleep(5 * time.Millisecond)
				}
				var wg sync.WaitGroup
				start := make(chan struct{})
				errs := make(chan error, clients)
				for range clients {
					wg.Go(func() {
						<-start
						for range queries {
							var n int
							if err := p.QueryRow(ctx, "select 1").Scan(&n); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				close(start)
				wg.Wait()
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				if n := p.totalConns(); n != conns {
					b.Fatalf("%d connections, want %d", n, conns)
				}
				idle := settledHeap()
				p.Close()
				// What a closed pool's connections leave behind (goroutines that end after Close
				// returns) is measured after, so that the order of the contenders does not matter.
				time.Sleep(200 * time.Millisecond)
				after := settledHeap()
				perConn = float64(idle-max(before, after)) / conns
			}
			b.ReportMetric(perConn, "B/conn")
		})
	}
}

// settledHeap is the heap in use once the collector has run twice: sync.Pool's caches (pgx's and
// wire's buffers for reads) survive one collection in its victim cache, and are nobody's.
func settledHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
