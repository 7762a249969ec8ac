package integration

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	migratepostgres "github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// sqlChurn runs statements and transactions on db from 6 goroutines until the returned func is
// called, so that sessions change hands between a migration tool's statements (each takes a few
// milliseconds, so that the pool's idle sessions are seldom the one a statement used last).
func sqlChurn(db *sql.DB) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if i%2 == 0 {
					_, _ = db.ExecContext(ctx, "select pg_sleep(0.003)")
					continue
				}
				if tx, err := db.BeginTx(ctx, nil); err == nil {
					_, _ = tx.ExecContext(ctx, "select pg_sleep(0.003)")
					_ = tx.Rollback()
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// noSessionLeftovers checks that no advisory lock is held and no session sits in a transaction
// on the database of pool (the migration tools close their *sql.DB).
func noSessionLeftovers(t *testing.T, pool *pgxlanes.Pool) {
	t.Helper()
	ctx := context.Background()
	var locks, inTx int
	require.NoError(t, pool.QueryRow(ctx, "select count(*) from pg_locks where locktype = 'advisory'").Scan(&locks))
	assert.Zero(t, locks, "advisory locks left held")
	require.NoError(t, pool.QueryRow(ctx,
		"select count(*) from pg_stat_activity where datname = current_database() and state like 'idle in transaction%'").Scan(&inTx))
	if !assert.Zero(t, inTx, "sessions left in a transaction") {
		rows, err := pool.Query(ctx, "select pid, state, query from pg_stat_activity where datname = current_database()")
		require.NoError(t, err)
		for rows.Next() {
			var pid int
			var state, query string
			require.NoError(t, rows.Scan(&pid, &state, &query))
			t.Logf("session %d %s: %s", pid, state, query)
		}
		rows.Close()
	}
}

var migrateFS = fstest.MapFS{
	"1_things.up.sql":   {Data: []byte("create table things (id int primary key, name text not null);")},
	"1_things.down.sql": {Data: []byte("drop table things;")},
	"2_note.up.sql":     {Data: []byte("alter table things add column note text; insert into things values (1, 'one', 'first');")},
	"2_note.down.sql":   {Data: []byte("alter table things drop column note;")},
}

// golang-migrate's postgres (lib/pq's SQL, on any *sql.DB) and pgx/v5 drivers run up and down
// on a *sql.DB of the bridge while other traffic runs, two migrators at once: each takes its
// advisory lock on a sql.Conn and releases it on the same session, so the second waits for the
// first instead of running beside it, and no lock is left behind. Without the sql.Conn pinning
// one session, the lock stayed with a pooled session and the next migrator waited forever.
func TestGolangMigrate(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(*sql.DB) (database.Driver, error)
	}{
		{"postgres", func(db *sql.DB) (database.Driver, error) {
			return migratepostgres.WithInstance(db, &migratepostgres.Config{})
		}},
		{"pgx/v5", func(db *sql.DB) (database.Driver, error) {
			return migratepgx.WithInstance(db, &migratepgx.Config{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newLanes(t, newDB(t, 10), "pool_max_conns=8")
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			stop := sqlChurn(db)
			defer stop()

			newMigrate := func() *migrate.Migrate {
				src, err := iofs.New(migrateFS, ".")
				require.NoError(t, err)
				drv, err := tc.open(db)
				require.NoError(t, err)
				m, err := migrate.NewWithInstance("iofs", src, tc.name, drv)
				require.NoError(t, err)
				return m
			}
			a, b := newMigrate(), newMigrate()
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, m := range []*migrate.Migrate{a, b} {
				wg.Go(func() { errs[i] = m.Up() })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil && !errors.Is(err, migrate.ErrNoChange) {
					t.Fatalf("up: %v", err)
				}
			}
			v, dirty, err := a.Version()
			require.NoError(t, err)
			assert.Equal(t, uint(2), v)
			assert.False(t, dirty)
			var note string
			require.NoError(t, db.QueryRow("select note from things where id = 1").Scan(&note))
			assert.Equal(t, "first", note)

			require.NoError(t, a.Down())
			var exists bool
			require.NoError(t, db.QueryRow("select to_regclass('things') is not null").Scan(&exists))
			assert.False(t, exists, "down dropped the table")
			for _, m := range []*migrate.Migrate{a, b} {
				srcErr, dbErr := m.Close()
				require.NoError(t, srcErr)
				require.NoError(t, dbErr)
			}
			stop()
			lanesIdle(t, pool, "after the migrations")
			noSessionLeftovers(t, pool)
		})
	}
}

var gooseFS = fstest.MapFS{
	"00001_things.sql": {Data: []byte(`-- +goose Up
create table things (id int primary key, name text not null);
-- +goose Down
drop table things;
`)},
	"00002_note.sql": {Data: []byte(`-- +goose Up
alter table things add column note text;
insert into things values (1, 'one', 'first');
-- +goose Down
alter table things drop column note;
`)},
}

// goose's Provider with its Postgres session locker runs up and down on a *sql.DB of the bridge
// while other traffic runs: the lock is taken and released on one sql.Conn, and none is left.
func TestGoose(t *testing.T) {
	ctx := context.Background()
	pool := newLanes(t, newDB(t, 10), "pool_max_conns=8")
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stop := sqlChurn(db)
	defer stop()

	locker, err := lock.NewPostgresSessionLocker()
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectPostgres, db, gooseFS, goose.WithSessionLocker(locker))
	require.NoError(t, err)
	res, err := p.Up(ctx)
	require.NoError(t, err)
	assert.Len(t, res, 2)
	v, err := p.GetDBVersion(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), v)
	var note string
	require.NoError(t, db.QueryRowContext(ctx, "select note from things where id = 1").Scan(&note))
	assert.Equal(t, "first", note)

	res, err = p.DownTo(ctx, 0)
	require.NoError(t, err)
	assert.Len(t, res, 2)
	require.NoError(t, p.Close())
	stop()
	lanesIdle(t, pool, "after goose")
	noSessionLeftovers(t, pool)
}
