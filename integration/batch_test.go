package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// The batch tests compare pgxlanes with plain pgxpool where the point is "the same as pgxpool".
// Several come from a review of the Batch.BeginTx support; each failed against an earlier
// version of it.

type batchSender interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}

// execModes are pgx's five query exec modes, as default_query_exec_mode values.
var execModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// TestBatchBeginTxGetsLaneSettings: a transaction begun in a batch (pgx.Batch.BeginTx) gets the
// same timeouts and budget backstops as one from Begin (with WithBudget, a backstop rounded up by
// at most 25 %), whichever way its results are read; the settings end with it, and the caller's
// batch is left as it was.
func TestBatchBeginTxGetsLaneSettings(t *testing.T) {
	ctx := context.Background()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=1&lane_tx_statement_timeout=30s&lane_tx_lock_timeout=7s&lane_tx_budget=20s")
	const showSQL = "select current_setting('statement_timeout') || '/' || current_setting('lock_timeout') || '/' || current_setting('idle_in_transaction_session_timeout')"
	inBegin := func(ctx context.Context) string {
		t.Helper()
		var got string
		err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error { return tx.QueryRow(ctx, showSQL).Scan(&got) })
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	outside := func() string {
		t.Helper()
		var got string
		if err := p.QueryRow(ctx, showSQL).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := inBegin(ctx)
	if !strings.HasPrefix(want, "30s/7s/") || strings.HasSuffix(want, "/0") {
		t.Fatalf("Begin: %s, want 30s/7s and a backstop", want)
	}
	wantOutside := outside()

	// Results read one by one: the BEGIN's, then the caller's own, never pgxlanes' settings query.
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(showSQL)
	b.Queue("update items set v = v + 1 where id = 1")
	br := p.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatalf("BEGIN's result: %v", err)
	}
	var got string
	if err := br.QueryRow().Scan(&got); err != nil || got != want {
		t.Fatalf("in the batch's transaction: %q %v, want %s as with Begin", got, err, want)
	}
	if ct, err := br.Exec(); err != nil || ct.String() != "UPDATE 1" {
		t.Fatalf("the batch's update: %q %v", ct, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if err := br.Tx().Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 3 {
		t.Fatalf("the caller's batch has %d queries after SendBatch, want its 3", b.Len())
	}
	if got := outside(); got != wantOutside {
		t.Fatalf("after the batch's transaction: %s, want %s", got, wantOutside)
	}

	// Results read by callbacks at Close, with a budget of its own. The settings in ms:
	// statement_timeout, lock_timeout, idle_in_transaction_session_timeout.
	const msSQL = "select array_agg(setting::int order by name desc) from pg_settings where name in ('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout')"
	ctx2 := pgxlanes.WithBudget(ctx, time.Minute)
	var want2 []int32
	if err := pgx.BeginFunc(ctx2, p, func(tx pgx.Tx) error { return tx.QueryRow(ctx, msSQL).Scan(&want2) }); err != nil {
		t.Fatal(err)
	}
	b = &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	var iso string
	var got2 []int32
	b.Queue(msSQL).QueryRow(func(r pgx.Row) error { return r.Scan(&got2) })
	b.Queue("show transaction_isolation").QueryRow(func(r pgx.Row) error { return r.Scan(&iso) })
	br = p.SendBatch(ctx2, b)
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if err := br.Tx().Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if len(want2) != 3 || len(got2) != 3 || want2[0] != 30_000 || got2[0] != want2[0] || got2[1] != want2[1] ||
		got2[2] < want2[2] || float64(got2[2]) > 1.25*float64(want2[2]) || iso != "repeatable read" {
		t.Fatalf("batch with callbacks and WithBudget: settings %v, %s; want %v (the backstop up to 25 %% more), repeatable read", got2, iso, want2)
	}
	t.Logf("WithBudget(1m): Begin %v ms, batch %v ms", want2, got2)
	var v int
	if err := p.QueryRow(ctx, "select v from items where id = 1").Scan(&v); err != nil || v != 2 {
		t.Fatalf("v = %d %v: the batch's update must have committed", v, err)
	}
	if n := p.Stat().NewConnsCount(); n != 1 {
		t.Fatalf("%d connections opened, want the one", n)
	}
}

// TestBatchBeginTxCustomBeginQuery: a Batch.BeginTx whose BeginQuery does not start with "begin"
// still begins a transaction that the caller can commit, as with pgxpool.
func TestBatchBeginTxCustomBeginQuery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dsn := newDB(t, 1)
	p := newLanes(t, dsn, "lane_tx_lock_timeout=7s")
	for _, q := range []string{"start transaction", "Begin", " begin"} {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{BeginQuery: q})
		b.Queue("update items set v = v + 1 where id = 1")
		var lt string
		b.Queue("select current_setting('lock_timeout')").QueryRow(func(r pgx.Row) error { return r.Scan(&lt) })
		br := p.SendBatch(ctx, b)
		err := br.Close()
		tx := br.Tx()
		if tx == nil {
			t.Fatalf("BeginQuery %q: Close %v, and Tx() is nil: the caller cannot commit", q, err)
		}
		if err != nil {
			t.Fatalf("BeginQuery %q: %v", q, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("BeginQuery %q: commit: %v", q, err)
		}
		if lt != "7s" {
			t.Errorf("BeginQuery %q: lock_timeout %s in the transaction, want the Tx lane's 7s", q, lt)
		}
	}
	var v int
	if err := p.QueryRow(ctx, "select v from items where id = 1").Scan(&v); err != nil || v != 4 {
		t.Fatalf("v = %d %v, want 4: every batch's update committed", v, err)
	}
	lanesIdle(t, p, "after the batches")
}

// TestBatchBeginTxSetTransaction: SET TRANSACTION right after the batch's BEGIN works, as with
// pgxpool. pgxlanes' settings are SET LOCAL, which take no snapshot; a SELECT would have.
func TestBatchBeginTxSetTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dsn := newDB(t, 1)
	for _, mode := range execModes {
		for name, db := range map[string]batchSender{
			"pgxpool":  newPgxpool(t, dsn, "default_query_exec_mode="+mode),
			"pgxlanes": newLanes(t, dsn, "default_query_exec_mode="+mode),
		} {
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			b.Queue("set transaction isolation level serializable")
			var iso string
			b.Queue("show transaction_isolation").QueryRow(func(r pgx.Row) error { return r.Scan(&iso) })
			br := db.SendBatch(ctx, b)
			err := br.Close()
			if tx := br.Tx(); tx != nil {
				_ = tx.Rollback(ctx)
			}
			if err != nil || iso != "serializable" {
				t.Errorf("%s, %s: %q %v, want serializable", mode, name, iso, err)
			}
		}
	}
}

// TestBatchBeginTxTimeoutEveryMode: in every exec mode, the statements of a batch's transaction
// run under the Tx lane's statement_timeout, not Short's.
func TestBatchBeginTxTimeoutEveryMode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn := newDB(t, 1)
	for _, mode := range execModes {
		p := newLanes(t, dsn, "default_query_exec_mode="+mode+"&lane_short_statement_timeout=300ms&lane_short_budget=10s&lane_tx_statement_timeout=10s")
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.Queue("select pg_sleep(0.6)")
		b.Queue("select current_setting('statement_timeout')")
		br := p.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			t.Errorf("%s: begin: %v", mode, err)
		}
		if _, err := br.Exec(); err != nil {
			t.Errorf("%s: a 600ms sleep under the Tx lane's 10s: %v", mode, err)
		}
		var st string
		if err := br.QueryRow().Scan(&st); err != nil || st != "10s" {
			t.Errorf("%s: statement_timeout %q %v, want 10s", mode, st, err)
		}
		if err := br.Close(); err != nil {
			t.Errorf("%s: close: %v", mode, err)
		}
		if err := br.Tx().Rollback(ctx); err != nil {
			t.Errorf("%s: rollback: %v", mode, err)
		}
		lanesIdle(t, p, mode)
	}
}

// TestBatchBeginTxDeferrable: a SERIALIZABLE READ ONLY DEFERRABLE transaction waits for a safe
// snapshot in its first query. That wait falls under the Tx lane's statement_timeout, in a batch
// as with BeginTx, not under Short's.
func TestBatchBeginTxDeferrable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := newDB(t, 3)
	p := newLanes(t, dsn, "lane_short_statement_timeout=300ms&lane_tx_statement_timeout=10s")
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable, AccessMode: pgx.ReadOnly, DeferrableMode: pgx.Deferrable}
	for _, how := range []string{"BeginTx", "batch"} {
		other, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Exec(ctx, "begin isolation level serializable; select sum(v) from items; update items set v = v + 1 where id = 1"); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(time.Second)
			_, _ = other.Exec(context.Background(), "commit")
			_ = other.Close(context.Background())
		}()
		var n int
		if how == "BeginTx" {
			err = pgx.BeginTxFunc(ctx, p, opts, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, "select count(*) from items").Scan(&n)
			})
		} else {
			b := &pgx.Batch{}
			b.BeginTx(opts)
			b.Queue("select count(*) from items").QueryRow(func(r pgx.Row) error { return r.Scan(&n) })
			br := p.SendBatch(ctx, b)
			err = br.Close()
			if tx := br.Tx(); tx != nil {
				_ = tx.Rollback(ctx)
			}
		}
		<-done
		if err != nil || n != 3 {
			t.Errorf("%s: %d %v, want 3 rows after waiting about 1s for a safe snapshot", how, n, err)
		}
	}
}

// TestBatchFailedBeginCallbacks: when the BEGIN fails, Close runs the callbacks of the same
// queries as with pgxpool, in every exec mode. (In exec and simple-protocol modes pgx lets each
// failed read take its query's turn, so skipping pgxlanes' own results must not take the
// caller's.)
func TestBatchFailedBeginCallbacks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := newDB(t, 1)
	run := func(db batchSender) string {
		var called []string
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{IsoLevel: "bogus"}) // BEGIN fails with 42601
		b.Queue("select 1").QueryRow(func(r pgx.Row) error { called = append(called, "first"); return r.Scan(new(int)) })
		b.Queue("select 2").QueryRow(func(r pgx.Row) error { called = append(called, "second"); return r.Scan(new(int)) })
		br := db.SendBatch(ctx, b)
		_, _ = br.Exec() // the BEGIN's result
		_, _ = br.Exec() // "select 1"'s, read by hand
		_ = br.Close()   // runs the callbacks of the unread queries
		_ = br.Tx().Rollback(ctx)
		return fmt.Sprint(called)
	}
	for _, mode := range execModes {
		want := run(newPgxpool(t, dsn, "default_query_exec_mode="+mode))
		p := newLanes(t, dsn, "default_query_exec_mode="+mode)
		if got := run(p); got != want {
			t.Errorf("%s: callbacks run at Close: %s, want %s as with pgxpool", mode, got, want)
		}
		lanesIdle(t, p, mode)
	}
}

// TestBatchHandBeginKeepsLaneTimeouts: a batch that begins and commits a transaction by hand and
// goes on runs its later statements with the Tx lane's timeouts, set on the session for it.
func TestBatchHandBeginKeepsLaneTimeouts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newLanes(t, newDB(t, 1), "lane_short_statement_timeout=300ms&lane_short_budget=10s&lane_tx_statement_timeout=10s")
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue("update items set v = v + 1 where id = 1")
	b.Queue("commit")
	b.Queue("select pg_sleep(0.6)")
	if err := p.SendBatch(ctx, b).Close(); err != nil {
		t.Errorf("batch begun by hand, on the Tx lane: %v", err)
	}
	lanesIdle(t, p, "after the batch")
	var st string
	if err := p.QueryRow(ctx, "select current_setting('statement_timeout')").Scan(&st); err != nil || st != "300ms" {
		t.Fatalf("statement_timeout after the batch: %q %v, want Short's 300ms back", st, err)
	}
}

// TestBatchBudgetsDoNotFillStatementCache: per-call budgets give the settings queries few
// distinct texts, so the default exec mode, which prepares and caches each text, does not fill
// the connection's statement cache with them.
func TestBatchBudgetsDoNotFillStatementCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=1")
	for i := range 40 {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.Queue("select 1")
		br := p.SendBatch(pgxlanes.WithBudget(ctx, time.Minute+time.Duration(i)*time.Second), b)
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		if err := br.Tx().Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var n int
	if err := c.QueryRow(ctx, "select count(*) from pg_prepared_statements").Scan(&n); err != nil {
		t.Fatal(err)
	}
	// select 1, the count itself, lock_timeout, and at most 2 grid values each for the other two
	// settings: budgets of 60-99 s have backstops of 126-208 s.
	if n > 8 {
		t.Errorf("%d prepared statements on the connection after 40 batches with distinct budgets, want at most 8", n)
	}
}

// TestBatchResultsLikePgxpool reads batches that begin a transaction in many orders (by hand,
// through callbacks at Close, rows left to Close, errors in the middle, a failing BEGIN) in every
// exec mode, and requires exactly what plain pgxpool gives: pgxlanes' hidden settings queries
// must never show.
func TestBatchResultsLikePgxpool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn := newDB(t, 3)
	queryLists := [][]string{
		{"select 1", "select 2", "select 3"},
		{"select 1", "select 1/0", "select 3"},
		{"select 1/0", "select 2"},
		{"select 1"},
		{},
	}
	fnSets := []map[int]bool{nil, {0: true}, {1: true}, {0: true, 2: true}}
	opsList := []string{"", "E", "EE", "EEEE", "ERQ", "EC", "CE", "ECE", "Q", "QQ", "RRRRR", "EQC"}
	for _, opts := range []pgx.TxOptions{{}, {IsoLevel: "bogus"}, {AccessMode: pgx.ReadOnly}} {
		for _, mode := range execModes {
			pp := newPgxpool(t, dsn, "default_query_exec_mode="+mode)
			pl := newLanes(t, dsn, "default_query_exec_mode="+mode)
			for qi, qs := range queryLists {
				for fi, fns := range fnSets {
					for _, ops := range opsList {
						want := readBatch(ctx, pp, opts, qs, fns, ops)
						got := readBatch(ctx, pl, opts, qs, fns, ops)
						if w, g := strings.Join(want, "\n"), strings.Join(got, "\n"); w != g {
							t.Errorf("%s, begin %+v, queries %d, callbacks %d, reads %q:\npgxpool:\n%s\npgxlanes:\n%s", mode, opts, qi, fi, ops, w, g)
						}
						lanesIdle(t, pl, "after a batch")
					}
				}
			}
		}
	}
}

// readBatch sends a batch that begins a transaction and reads it with ops (E Exec, R QueryRow,
// Q Query read to the end, C Close), recording everything the caller can see.
func readBatch(ctx context.Context, db batchSender, opts pgx.TxOptions, queries []string, fns map[int]bool, ops string) []string {
	var out []string
	rec := func(s string, args ...any) { out = append(out, fmt.Sprintf(s, args...)) }
	b := &pgx.Batch{}
	b.BeginTx(opts)
	for i, q := range queries {
		qq := b.Queue(q)
		if fns[i] {
			qq.Query(func(rows pgx.Rows) error {
				n := 0
				for rows.Next() {
					v, _ := rows.Values()
					rec("callback %d row %v", i, v)
					n++
				}
				rec("callback %d err %v rows %d", i, rows.Err(), n)
				return rows.Err()
			})
		}
	}
	br := db.SendBatch(ctx, b)
	for _, op := range ops {
		switch op {
		case 'E':
			ct, err := br.Exec()
			rec("Exec %q %v", ct.String(), err)
		case 'R':
			var v any
			err := br.QueryRow().Scan(&v)
			rec("QueryRow %v %v", v, err)
		case 'Q':
			rows, err := br.Query()
			rec("Query %v", err)
			for rows.Next() {
				v, _ := rows.Values()
				rec("Query row %v", v)
			}
			rec("Query rows.Err %v tag %q", rows.Err(), rows.CommandTag().String())
		case 'C':
			rec("Close %v", br.Close())
		}
	}
	rec("final Close %v", br.Close())
	if tx := br.Tx(); tx != nil {
		var v any
		err := tx.QueryRow(ctx, "select 42").Scan(&v)
		rec("after: tx query %v %v", v, err)
		rec("rollback %v", tx.Rollback(ctx))
	} else {
		rec("no tx")
	}
	return out
}
