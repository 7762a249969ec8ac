package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// probeInterval is how often the machine probe runs: 50 a second, a round trip each, on the demo's
// own admin connection, outside every contender's pools.
const probeInterval = 20 * time.Millisecond

// probe measures the machine while a contender runs: a "select 1" on the admin connection is due
// every probeInterval, and each records the time from when it was due to the end of its round
// trip. It needs no pool, so what delays it is the machine: the Go scheduler, the server's
// backends, the other processes on the CPUs. The verdict calls a phase inconclusive when the
// probe shows the machine itself stalled for a good part of a transaction's hold then (verdict.go).
// It returns when ctx ends; the admin connection is free again once the returned channel closes.
func probe(ctx context.Context, conn *pgx.Conn, rec *recorder) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		due := time.Now()
		for {
			due = due.Add(probeInterval)
			if !sleepCtx(ctx, time.Until(due)) {
				return
			}
			// Not under ctx: a query interrupted by its context makes pgx close the connection,
			// and the admin connection must outlive the run (sessionsAfter, the next contender).
			qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_, err := conn.Exec(qctx, "select 1")
			cancel()
			if err != nil {
				if conn.IsClosed() {
					return
				}
				continue // a failed probe is not a latency
			}
			// After a stall the probes that fell due meanwhile run at once, each timed from its
			// own due time: a stall counts for as long as it lasted, not as one late probe
			// (coordinated omission).
			rec.probed(due, time.Since(due))
		}
	}()
	return done
}
