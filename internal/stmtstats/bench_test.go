package stmtstats_test

import (
	"fmt"
	"hash/maphash"
	"sync"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// learner is the tiny interface through which BenchmarkClassifyObserve compares the Table with
// its baseline: what a caller does per run, classify then observe.
type learner interface {
	run(sql string, d time.Duration) bool
}

type table struct{ t *stmtstats.Table }

func (l table) run(sql string, d time.Duration) bool {
	k := l.t.Key(sql)
	demoted := l.t.Demoted(k)
	l.t.Done(k, d, false)
	return demoted
}

// tableArrive is what the pool does per call: Arrive (Classify and the call counted for the
// relative rule) instead of Classify.
type tableArrive struct{ t *stmtstats.Table }

func (l tableArrive) run(sql string, d time.Duration) bool {
	k := l.t.Key(sql)
	demoted := l.t.Arrive(k) == stmtstats.Slow
	l.t.Done(k, d, false)
	return demoted
}

// hashOnly is the baseline: the hash of the text, which any per-statement table pays.
type hashOnly struct{ seed maphash.Seed }

func (h hashOnly) run(sql string, _ time.Duration) bool { return maphash.String(h.seed, sql)&1 == 0 }

type benchStatement struct {
	sql string
	d   time.Duration
}

// benchStatements returns n statements of about 80 bytes; one in 16 is slow.
func benchStatements(n int) []benchStatement {
	s := make([]benchStatement, n)
	for i := range s {
		s[i] = benchStatement{fmt.Sprintf("select id, name, email, created_at from users%04d where tenant = $1 and id = $2", i), fastRun}
		if i%16 == 15 {
			s[i].d = lockWait
		}
	}
	return s
}

// BenchmarkClassifyObserve: Key + Demoted (or Arrive, as the pool calls it) + Done per op, by
// many goroutines at once. ns/op is
// wall time divided by all goroutines' ops. Statements=1 is one hot statement that every
// goroutine runs; Statements=1024 a mix in which one statement in 16 is slow and demoted.
// Compare with: benchstat -col /Work.
func BenchmarkClassifyObserve(b *testing.B) {
	for _, n := range []int{1, 1024} {
		stmts := benchStatements(n)
		for _, g := range []int{1, 8, 64} {
			for _, work := range []string{"HashOnly", "Table", "TableArrive"} {
				b.Run(fmt.Sprintf("Statements=%d/Goroutines=%d/Work=%s", n, g, work), func(b *testing.B) {
					var l learner = hashOnly{maphash.MakeSeed()}
					if work != "HashOnly" {
						tab := newTable(b, 0)
						for range 3 { // learn the slow ones first: the steady state
							for _, s := range stmts {
								table{tab}.run(s.sql, s.d)
							}
						}
						l = table{tab}
						if work == "TableArrive" {
							l = tableArrive{tab}
						}
					}
					b.ReportAllocs()
					b.ResetTimer()
					var wg sync.WaitGroup
					for i := range g {
						ops := b.N / g
						if i < b.N%g {
							ops++
						}
						wg.Go(func() {
							demoted := 0
							for j := range ops {
								s := stmts[(i*97+j)%len(stmts)]
								if l.run(s.sql, s.d) {
									demoted++
								}
							}
							sink.Add(int64(demoted))
						})
					}
					wg.Wait()
				})
			}
		}
	}
}

// BenchmarkInsert: every op is the first slow run of a new statement, in a full Table. Slow
// runs last at least Threshold, so this path runs at most (concurrent runs / Threshold) times a
// second.
func BenchmarkInsert(b *testing.B) {
	tab := newTable(b, 0)
	keys := make([]stmtstats.Key, 1<<16)
	for i := range keys {
		keys[i] = tab.Key(fmt.Sprintf("select c%d", i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tab.Overran(keys[i%len(keys)])
		i++
	}
}

var sink syncCounter

type syncCounter struct {
	mu sync.Mutex
	n  int64
}

func (c *syncCounter) Add(n int64) { c.mu.Lock(); c.n += n; c.mu.Unlock() }
