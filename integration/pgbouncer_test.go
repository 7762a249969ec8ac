package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/integration/harness"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestThroughPgBouncerTransactionMode: behind PgBouncer in transaction mode, only SET LOCAL is
// safe. With TransactionPooler set, pgxlanes sends no startup parameters and no session SET: a
// transaction gets its lane's timeouts with SET LOCAL, a plain statement afterwards sees the
// server's defaults (nothing leaked into the shared server session), and terminate, which needs
// the server's PID, is refused.
func TestThroughPgBouncerTransactionMode(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 10)
	bouncer, stop, err := harness.StartPgBouncer(ctx, dsn, "transaction")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// Without the option, PgBouncer refuses the startup parameters.
	plainCfg := withParams(bouncer, "pool_max_conns=2&default_query_exec_mode=exec")
	p0, err := pgxlanes.New(ctx, plainCfg)
	if err != nil {
		t.Fatal(err)
	}
	err = p0.Ping(ctx)
	p0.Close()
	if err == nil || !strings.Contains(err.Error(), "unsupported startup parameter") {
		t.Fatalf("PgBouncer accepted pgxlanes' startup parameters (%v): the option's doc is out of date", err)
	}

	p := newLanes(t, bouncer, "pool_max_conns=4&default_query_exec_mode=exec&pgxlanes_transaction_pooler=true"+
		"&lane_tx_statement_timeout=7s&lane_tx_lock_timeout=3s")
	setting := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		t.Helper()
		var st string
		if err := q.QueryRow(ctx, "select current_setting('statement_timeout') || '/' || current_setting('lock_timeout')").Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if got := setting(tx); got != "7s/3s" {
			t.Errorf("transaction through PgBouncer: %s, want 7s/3s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// So does a transaction begun in a batch: behind a transaction pooler a session SET would land
	// on some other client's server connection, so only the settings pgxlanes queues after the
	// batch's BEGIN can give it the lane's timeouts.
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	var inBatch string
	b.Queue("select current_setting('statement_timeout') || '/' || current_setting('lock_timeout')").QueryRow(func(r pgx.Row) error {
		return r.Scan(&inBatch)
	})
	br := p.SendBatch(ctx, b)
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if err := br.Tx().Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if inBatch != "7s/3s" {
		t.Errorf("transaction begun in a batch through PgBouncer: %s, want 7s/3s", inBatch)
	}
	for range 5 {
		if got := setting(p); got != "0/0" {
			t.Fatalf("plain statement after a transaction: %s, want the server defaults 0/0", got)
		}
	}
	// No cancel through this PgBouncer: 1.18 (Debian 12) can crash on a cancel request
	// (pgbouncer/pgbouncer#801, "bad client state: 0", fixed after 1.18).
	if err := p.QueryRow(ctx, "select 1").Scan(new(int)); err != nil {
		t.Fatal(err)
	}

	// terminate needs the server's PID, which PgBouncer hides.
	_, err = pgxlanes.New(ctx, withParams(bouncer, "pgxlanes_transaction_pooler=true&lane_tx_over_budget=terminate"))
	if err == nil || !strings.Contains(err.Error(), "lane_tx_over_budget") {
		t.Fatalf("terminate behind a transaction pooler: %v", err)
	}
}
