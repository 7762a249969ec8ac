// Package pgxlanes is a PostgreSQL connection pool for pgx whose short queries never wait behind
// long transactions. It replaces pgxpool: change the import and pgxpool.New to pgxlanes.New.
//
//	pool, err := pgxlanes.New(ctx, "postgres://app@db/app?pool_max_conns=20")
//
// # Lanes
//
// The pool's connections are split between three lanes:
//   - Short: plain queries (Query, QueryRow, Exec, SendBatch, Ping);
//   - Tx: transactions and held connections (Begin, BeginTx, Acquire, AcquireFunc, CopyFrom);
//   - Long: work annotated with WithLane(ctx, Long).
//
// Each lane has a reserve that no other lane's unbounded work may take, a cap, a bounded FIFO
// queue, an acquire timeout, statement and lock timeouts, and a budget. Short's hold time is
// bounded by its statement timeout, so Short alone may borrow idle connections of the other lanes;
// Tx and Long never take Short's reserve. A short query therefore only ever queues behind other
// short queries. The reserve package holds the admission rules and the proof of that invariant.
//
// # Context
//
// The context of a call chooses its lane (WithLane), its budget (WithBudget), a label for logs,
// errors and metrics (WithTag) and its place in the lane's queue (WithPriority); AnnotationsFrom
// reads them back. Otherwise, as with pgxpool, ctx
// bounds the wait for a connection and the call itself. It does not end a transaction: Begin's
// ctx only covers the BEGIN, and the lane's budget is what bounds the transaction.
//
// # Releasing
//
// A lane slot is held exactly as long as its connection: until Rows.Close (or Next returning
// false), Row.Scan, BatchResults.Close, Tx.Commit or Tx.Rollback, Conn.Release or Conn.Hijack.
// Releasing twice is safe.
//
// # Errors
//
// A call that gets no connection returns an *AcquireError that matches ErrAcquireTimeout,
// ErrLaneFull, ErrClosed or the caller's ctx error with errors.Is, and says why:
//
//	pgxlanes: short lane: acquire timed out after 1s (in use 4/4, waiting 12)
//
// A lease that the guard cancelled or terminated for exceeding its budget fails its next calls,
// and its Commit, with a *BudgetError that matches ErrBudgetExceeded.
//
// # Budgets
//
// One goroutine per pool watches every lease against its budget and, per lane, flags, cancels or
// terminates it (see LaneConfig.OverBudget). Termination goes through a connection of its own,
// outside the lanes, so it works when every lane is full.
//
// # Metrics
//
// Stat has the methods of pgxpool.Stat plus Lane for per-lane figures. An Observer added with
// AddObserver receives every acquire and release; the metrics package turns them into Prometheus
// histograms. This package does not import Prometheus.
package pgxlanes
