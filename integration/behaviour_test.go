package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// DBTX is the interface sqlc generates; *pgxlanes.Pool must satisfy it as *pgxpool.Pool does.
type DBTX interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

var (
	_ DBTX = (*pgxlanes.Pool)(nil)
	_ DBTX = (*pgxlanes.Conn)(nil)
)

// poolAPI is the pgxpool method set that does not mention pgxpool's own types.
type poolAPI interface {
	DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	Ping(ctx context.Context) error
	Reset()
}

var (
	_ poolAPI = (*pgxpool.Pool)(nil)
	_ poolAPI = (*pgxlanes.Pool)(nil)
)

// heldConn is what both pools' Acquire return.
type heldConn interface {
	DBTX
	Release()
	Conn() *pgx.Conn
	Begin(ctx context.Context) (pgx.Tx, error)
}

// subject is one pool under the shared behaviour test.
type subject struct {
	db         poolAPI
	ctx        context.Context
	acquire    func(context.Context) (heldConn, error)
	acquireFn  func(context.Context, func(heldConn) error) error
	acquired   func() int32
	laneInUse  func() int // -1 for pgxpool
	acquireAll func(context.Context) int
}

// TestSharedBehaviour runs the whole pgxpool surface against plain pgxpool and against pgxlanes on
// each lane, and checks after each call that no connection (and no lane slot) is left held.
func TestSharedBehaviour(t *testing.T) {
	dsn := newDB(t, 10)
	plain := newPgxpool(t, dsn, "pool_max_conns=4")
	lanes := newLanes(t, dsn, "pool_max_conns=4")
	subjects := map[string]subject{
		"pgxpool": {
			db: plain, ctx: context.Background(),
			acquire: func(ctx context.Context) (heldConn, error) { return plain.Acquire(ctx) },
			acquireFn: func(ctx context.Context, f func(heldConn) error) error {
				return plain.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return f(c) })
			},
			acquired:  func() int32 { return plain.Stat().AcquiredConns() },
			laneInUse: func() int { return -1 },
			acquireAll: func(ctx context.Context) int {
				cs := plain.AcquireAllIdle(ctx)
				for _, c := range cs {
					c.Release()
				}
				return len(cs)
			},
		},
	}
	for _, lane := range pgxlanes.Lanes() {
		ctx := pgxlanes.WithLane(context.Background(), lane)
		subjects["pgxlanes/"+lane.String()] = subject{
			db: lanes, ctx: ctx,
			acquire: func(ctx context.Context) (heldConn, error) { return lanes.Acquire(ctx) },
			acquireFn: func(ctx context.Context, f func(heldConn) error) error {
				return lanes.AcquireFunc(ctx, func(c *pgxlanes.Conn) error { return f(c) })
			},
			acquired: func() int32 { return lanes.Stat().AcquiredConns() },
			laneInUse: func() int {
				st := lanes.Stat()
				n := 0
				for _, l := range pgxlanes.Lanes() {
					n += st.Lane(l).InUse
				}
				return n
			},
			acquireAll: func(ctx context.Context) int {
				cs := lanes.AcquireAllIdle(ctx)
				for _, c := range cs {
					if c.Lane() != lane {
						t.Errorf("AcquireAllIdle gave a %s connection, want %s", c.Lane(), lane)
					}
					c.Release()
				}
				return len(cs)
			},
		}
	}
	for name, s := range subjects {
		t.Run(name, func(t *testing.T) { behaviour(t, s) })
	}
}

func behaviour(t *testing.T, s subject) {
	ctx := s.ctx
	idle := func(step string) {
		t.Helper()
		if n := s.acquired(); n != 0 {
			t.Fatalf("after %s: %d connections still acquired", step, n)
		}
		if n := s.laneInUse(); n > 0 {
			t.Fatalf("after %s: %d lane slots still held", step, n)
		}
	}
	table := pgx.Identifier{"t_" + sanitize(t.Name())}
	if _, err := s.db.Exec(ctx, "create table "+table.Sanitize()+" (id int primary key, s text)"); err != nil {
		t.Fatal(err)
	}
	idle("Exec")

	n, err := s.db.CopyFrom(ctx, table, []string{"id", "s"}, pgx.CopyFromRows([][]any{{1, "a"}, {2, "b"}, {3, "c"}}))
	if err != nil || n != 3 {
		t.Fatalf("CopyFrom: %d %v", n, err)
	}
	idle("CopyFrom")

	rows, err := s.db.Query(ctx, "select id, s from "+table.Sanitize()+" order by id")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID int
		S  string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[row])
	if err != nil || len(got) != 3 || got[2] != (row{3, "c"}) {
		t.Fatalf("Query + CollectRows: %v %v", got, err)
	}
	idle("Query")

	var count int
	if err := s.db.QueryRow(ctx, "select count(*) from "+table.Sanitize()).Scan(&count); err != nil || count != 3 {
		t.Fatalf("QueryRow: %d %v", count, err)
	}
	idle("QueryRow")
	if err := s.db.QueryRow(ctx, "select id from "+table.Sanitize()+" where id = 99").Scan(&count); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("QueryRow no rows: %v", err)
	}
	idle("QueryRow no rows")
	if _, err := s.db.Query(ctx, "select nonsense from nowhere"); err == nil {
		t.Fatal("Query of a missing table succeeded")
	}
	idle("failed Query")

	b := &pgx.Batch{}
	b.Queue("insert into " + table.Sanitize() + " values (4, 'd')")
	b.Queue("select count(*) from " + table.Sanitize())
	br := s.db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	if err := br.QueryRow().Scan(&count); err != nil || count != 4 {
		t.Fatalf("SendBatch: %d %v", count, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	idle("SendBatch")

	bt := &pgx.Batch{}
	bt.BeginTx(pgx.TxOptions{})
	bt.Queue("insert into " + table.Sanitize() + " values (5, 'e')")
	br = s.db.SendBatch(ctx, bt)
	tx := br.Tx()
	if tx == nil {
		t.Fatal("batch with BeginTx has no Tx")
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	idle("SendBatch with BeginTx")

	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "insert into "+table.Sanitize()+" values (6, 'f')")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	idle("BeginFunc")
	err = pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "insert into "+table.Sanitize()+" values (7, 'g')")
		return err
	})
	if sqlState(err) != "25006" { // read_only_sql_transaction
		t.Fatalf("read-only BeginTxFunc: %v", err)
	}
	idle("BeginTxFunc")

	tx, err = s.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "delete from "+table.Sanitize()); err != nil {
		t.Fatal(err)
	}
	sp, err := tx.Begin(ctx) // savepoint
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("second Rollback: %v", err)
	}
	idle("Begin/Rollback")

	if err := s.db.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	idle("Ping")

	c, err := s.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "select count(*) from "+table.Sanitize()).Scan(&count); err != nil || count != 6 {
		t.Fatalf("held conn: %d %v", count, err)
	}
	ctx2 := context.WithoutCancel(ctx)
	ctx2 = pgxlanes.WithTag(ctx2, "t") // annotations survive derivation
	if pgxlanes.AnnotationsFrom(ctx2).LaneSet != pgxlanes.AnnotationsFrom(ctx).LaneSet {
		t.Fatal("WithTag lost the lane")
	}
	if c.Conn() == nil {
		t.Fatal("Conn() is nil")
	}
	c.Release()
	c.Release()
	idle("Acquire/Release")

	err = s.acquireFn(ctx, func(c heldConn) error {
		_, err := c.Exec(ctx, "select 1")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	idle("AcquireFunc")
	if n := s.acquireAll(ctx); n < 1 {
		t.Fatalf("AcquireAllIdle returned %d connections", n)
	}
	idle("AcquireAllIdle")
	s.db.Reset()
	if err := s.db.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	idle("Reset")
}

func sanitize(name string) string {
	out := make([]byte, 0, len(name))
	for _, c := range []byte(name) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			out = append(out, c)
		} else {
			out = append(out, '_')
		}
	}
	return string(out)
}
