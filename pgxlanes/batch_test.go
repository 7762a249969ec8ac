package pgxlanes

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestCoarseUp(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 999 * time.Millisecond, time.Second, 1001 * time.Millisecond,
		7 * time.Second, 33 * time.Second, 126 * time.Second, 81 * time.Minute, 24 * time.Hour, maxPGTimeout - 1} {
		got := coarseUp(d)
		if got < d || float64(got) > 1.25*float64(d) {
			t.Errorf("coarseUp(%v) = %v, want within [d, 1.25 d]", d, got)
		}
		if again := coarseUp(got); again != got {
			t.Errorf("coarseUp(coarseUp(%v)) = %v, want %v: not a fixed point", d, again, got)
		}
	}
	if got := coarseUp(maxPGTimeout + time.Hour); got != maxPGTimeout {
		t.Errorf("coarseUp past PostgreSQL's largest timeout = %v, want %v", got, maxPGTimeout)
	}
	// A program that computes its budgets (say from a deadline) gets few distinct SQL texts: the
	// backstops of budgets between 1 and 2 minutes span less than one decade, so at most 5 grid
	// values each for statement_timeout and idle_in_transaction_session_timeout, and one
	// lock_timeout. Unrounded, these 8,572 budgets would give about 17,000 texts.
	lc := LaneConfig{StatementTimeout: time.Hour, LockTimeout: time.Second, Budget: 30 * time.Second, OverBudget: ActionCancel}
	texts := map[string]bool{}
	for ms := 60_000; ms < 120_000; ms += 7 {
		for _, sql := range (sessionSQL{pooler: true}).batchLocals(lc, time.Duration(ms)*time.Millisecond) {
			texts[sql] = true
		}
	}
	if len(texts) > 11 {
		t.Errorf("%d distinct SET LOCAL texts for budgets between 1 and 2 minutes, want a handful: %v", len(texts), texts)
	}
}

func TestBatchKindOf(t *testing.T) {
	beginTx := func(q string) *pgx.Batch {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{BeginQuery: q})
		return b
	}
	queued := func(sqls ...string) *pgx.Batch {
		b := &pgx.Batch{}
		for _, s := range sqls {
			b.Queue(s)
		}
		return b
	}
	for _, c := range []struct {
		name string
		b    *pgx.Batch
		want batchKind
	}{
		{"nil", nil, batchPlain},
		{"empty", &pgx.Batch{}, batchPlain},
		{"plain", queued("select 1"), batchPlain},
		{"BeginTx", beginTx(""), batchBeginTx},
		{"BeginTx with start transaction", beginTx("start transaction"), batchBeginTx},
		{"begin by hand", queued("begin", "select 1", "commit"), batchHandBegin},
		{"BEGIN by hand, indented", queued("\n  BEGIN ISOLATION LEVEL SERIALIZABLE"), batchHandBegin},
		{"short", queued("beg"), batchPlain},
	} {
		if got := batchKindOf(c.b); got != c.want {
			t.Errorf("%s: batchKindOf = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestWithQueriesAfterFirst: the copy keeps BeginTx's options and the caller's batch is not
// changed.
func TestWithQueriesAfterFirst(t *testing.T) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("select 1")
	nb := withQueriesAfterFirst(b, []string{"set local a = 1", "set local b = 2"})
	if b.Len() != 2 || nb.Len() != 4 {
		t.Fatalf("lengths %d and %d, want 2 and 4", b.Len(), nb.Len())
	}
	if nb.QueuedQueries[0] != b.QueuedQueries[0] || nb.QueuedQueries[1].SQL != "set local a = 1" ||
		nb.QueuedQueries[2].SQL != "set local b = 2" || nb.QueuedQueries[3] != b.QueuedQueries[1] {
		t.Fatalf("queries %v", nb.QueuedQueries)
	}
	if batchKindOf(nb) != batchBeginTx {
		t.Fatal("the copy lost BeginTx's options")
	}
}
