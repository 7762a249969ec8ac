package integration

import (
	"context"
	"database/sql"
	"testing"
	"time"

	pgxstdlib "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// sqlHeadline is headline's workload through database/sql: the transactions are db.BeginTx and
// the lookups db.QueryRowContext.
func sqlHeadline(t *testing.T, db *sql.DB, txHolders int, hold, duration time.Duration) *latencies {
	t.Helper()
	return headlineLoad(t, txHolders, hold, duration,
		func(ctx context.Context, id int) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck
			if err := tx.QueryRowContext(ctx, "select v from items where id = $1 for update", id).Scan(new(int)); err != nil {
				return err
			}
			time.Sleep(hold) // application work while the row stays locked
			return nil
		},
		func(ctx context.Context, id int) error {
			return db.QueryRowContext(ctx, "select v from items where id = $1", id).Scan(new(int))
		})
}

// TestStdlibHeadline is the headline through database/sql: 10 row-locking transactions on 8
// connections. On pgxlanes' stdlib the lookups keep a p99 under 50 ms; on pgx's
// stdlib.OpenDBFromPool over a pgxpool of the same size they wait behind the transactions.
func TestStdlibHeadline(t *testing.T) {
	dsn := newDB(t, 1000)
	const txHolders = 10
	hold, duration := 1500*time.Millisecond, 3*time.Second

	lanes := newLanes(t, dsn, "pool_max_conns=8")
	lanesDB := stdlib.OpenDBFromPool(lanes)
	defer lanesDB.Close()
	lanesLat := sqlHeadline(t, lanesDB, txHolders, hold, duration)
	lanesIdle(t, lanes, "after the workload")

	plainDB := pgxstdlib.OpenDBFromPool(newPgxpool(t, dsn, "pool_max_conns=8"))
	defer plainDB.Close()
	plainLat := sqlHeadline(t, plainDB, txHolders, hold, duration)

	lp99, ln := lanesLat.quantile(0.99)
	pp99, pn := plainLat.quantile(0.99)
	t.Logf("pgxlanes stdlib: %d lookups, p99 %s, max %s", ln, fmtDur(lp99), fmtDur(lanesLat.max()))
	t.Logf("pgx stdlib on pgxpool: %d lookups, p99 %s, max %s; ratio p99 pgx/pgxlanes = %.0f×",
		pn, fmtDur(pp99), fmtDur(plainLat.max()), float64(pp99)/float64(max(lp99, time.Microsecond)))
	figure(t, "stdlib.pgxlanes_p99_ms", ms(lp99))
	figure(t, "stdlib.pgx_stdlib_p99_ms", ms(pp99))
	figure(t, "stdlib.ratio", float64(pp99)/float64(max(lp99, time.Microsecond)))
	if ln < 100 {
		t.Fatalf("pgxlanes completed only %d lookups", ln)
	}
	assert.Less(t, lp99, 50*time.Millisecond, "pgxlanes stdlib lookup p99")
	assert.GreaterOrEqual(t, pp99, 500*time.Millisecond, "pgx stdlib lookup p99: the workload did not reproduce head-of-line blocking")
}

type item struct {
	ID      int            `db:"id"`
	V       int            `db:"v"`
	Note    sql.NullString `db:"note"`
	Created time.Time      `db:"created"`
}

// sqlx runs on a pgxlanes *sql.DB: Get and Select into structs, named statements, sqlx.In,
// transactions and a pinned sqlx.Conn, each on its lane.
func TestSqlx(t *testing.T) {
	ctx := context.Background()
	pool := newLanes(t, newDB(t, 10), "pool_max_conns=8")
	db := sqlx.NewDb(stdlib.OpenDBFromPool(pool), "pgx")
	defer db.Close()
	db.MustExecContext(ctx, `alter table items add column note text, add column created timestamptz not null default '2024-01-02 03:04:05+00'`)
	lanes := func() [3]int {
		st := pool.Stat()
		return [3]int{st.Lane(pgxlanes.Short).InUse, st.Lane(pgxlanes.Tx).InUse, st.Lane(pgxlanes.Long).InUse}
	}

	var one item
	require.NoError(t, db.GetContext(ctx, &one, "select id, v, note, created from items where id = $1", 3))
	assert.Equal(t, item{ID: 3, V: 3, Created: time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)}, item{ID: one.ID, V: one.V, Note: one.Note, Created: one.Created.UTC()})

	_, err := db.NamedExecContext(ctx, "insert into items (id, v, note) values (:id, :v, :note)",
		[]item{{ID: 11, V: 110, Note: sql.NullString{String: "eleven", Valid: true}}, {ID: 12, V: 120}})
	require.NoError(t, err)

	query, args, err := sqlx.In("select id, v, note, created from items where id in (?) order by id", []int{2, 11, 12})
	require.NoError(t, err)
	var some []item
	require.NoError(t, db.SelectContext(ctx, &some, db.Rebind(query), args...))
	require.Len(t, some, 3)
	assert.Equal(t, []int{2, 11, 12}, []int{some[0].ID, some[1].ID, some[2].ID})
	assert.Equal(t, sql.NullString{String: "eleven", Valid: true}, some[1].Note)
	assert.False(t, some[2].Note.Valid)
	assert.Equal(t, [3]int{}, lanes(), "statements released their Short slots")

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, [3]int{0, 1, 0}, lanes(), "a transaction on Tx")
	var v int
	require.NoError(t, tx.GetContext(ctx, &v, "select v from items where id = $1 for update", 1))
	tx.MustExecContext(ctx, "update items set v = $1 where id = $2", v+100, 1)
	rows, err := tx.QueryxContext(ctx, "select * from items where id = $1", 1)
	require.NoError(t, err)
	require.True(t, rows.Next())
	var row item
	require.NoError(t, rows.StructScan(&row))
	require.NoError(t, rows.Close())
	assert.Equal(t, 101, row.V)
	require.NoError(t, tx.Commit())
	assert.Equal(t, [3]int{}, lanes())

	stmt, err := db.PrepareNamedContext(ctx, "select v from items where id = :id")
	require.NoError(t, err)
	require.NoError(t, stmt.GetContext(ctx, &v, map[string]any{"id": 12}))
	require.NoError(t, stmt.Close())
	assert.Equal(t, 120, v)

	conn, err := db.Connx(pgxlanes.WithLane(ctx, pgxlanes.Tx))
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "set application_name = 'sqlx'")
	require.NoError(t, err)
	var name string
	require.NoError(t, conn.GetContext(ctx, &name, "show application_name"))
	assert.Equal(t, "sqlx", name, "a sqlx.Conn named on a lane keeps its session")
	assert.Equal(t, [3]int{0, 1, 0}, lanes())
	require.NoError(t, conn.Close())
	lanesIdle(t, pool, "after sqlx")
}
