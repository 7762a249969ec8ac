package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// TestRunDeadlineEndsAStuckContender makes a long transaction wait for good: another session
// holds long worker 0's row lock for the whole run. The contender must end at its run's deadline
// with an error that says so, not wait for its caller's deadline: before the run had a deadline
// of its own, the run waited for the worker and the worker for the run's end.
func TestRunDeadlineEndsAStuckContender(t *testing.T) {
	t.Parallel() // it mostly waits, as TestDemo does
	dsn := pgserver.NewDatabase(t)
	cfg, _, err := parseFlags([]string{"-dsn", dsn, "-contenders", "pgxpool", "-plot", "",
		"-conns", "4", "-fast-conns", "1", "-rows", "100",
		"-long-workers", "4", "-burst-long-workers", "1", "-long-hold", "100ms",
		"-rate", "50", "-burst-rate", "50", "-burst-work", "0s",
		"-ramp", "100ms", "-steady", "300ms", "-burst", "300ms", "-timeout", "1s",
		"-slow-clients", "2", "-slow-sleep", "100ms", "-learn", "100ms", "-slow", "300ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := contenders(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if err := createTable(ctx, admin, cfg.rows); err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var val string
	if err := tx.QueryRow(ctx, lockSQL, 1).Scan(&val); err != nil { // row 1 is long worker 0's
		t.Fatal(err)
	}

	d := &demo{cfg: cfg, dsn: dsn, admin: admin, logf: t.Logf}
	res, err := d.runContender(ctx, specs[0])
	t.Logf("runContender: %v", err)
	switch {
	case ctx.Err() != nil:
		t.Fatalf("the contender ran until its caller's deadline: %v", err)
	case err == nil:
		t.Fatalf("the contender ended without an error, long tx: %+v", res.Long)
	case !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not wind down"):
		t.Fatalf("error %q, want the run's deadline", err)
	case !strings.Contains(err.Error(), "long workers cut off: 1"):
		t.Errorf("error %q, want the one stuck long worker counted", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("the lock holder's session: %v", err)
	}
}
