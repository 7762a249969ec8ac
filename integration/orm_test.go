package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/jackc/pgx/v5/pgconn"
	pgxstdlib "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pgxlanes/pgxlanes/stdlib"
)

// Item is the items table for GORM and bun.
type Item struct {
	bun.BaseModel `bun:"table:items" gorm:"-"`
	ID            int `bun:"id,pk" gorm:"primaryKey"`
	V             int `bun:"v"`
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// ormStorm is the storm for one ORM: 8 transactions through the ORM's transaction API lock a row
// each for 1.5 s, 8 clients do primary-key lookups through its normal path, a pool of 8; once on
// the bridge, once on pgx's stdlib over a pgxpool of the same size, in the same test. The bridge's
// lookups keep a p99 far below the hold; pgx's stdlib's wait behind the transactions.
func ormStorm(t *testing.T, name string, dsn string, run func(db *sql.DB) (lockRow, lookup func(ctx context.Context, id int) error)) {
	t.Helper()
	const holders = 8
	hold, duration := 1500*time.Millisecond, 2*time.Second
	lanes := newLanes(t, dsn, "pool_max_conns=8")
	bridge := stdlib.OpenDBFromPool(lanes)
	defer bridge.Close()
	lock, look := run(bridge)
	bl := headlineLoad(t, holders, hold, duration, lock, look)
	lanesIdle(t, lanes, "after the "+name+" storm")

	plain := pgxstdlib.OpenDBFromPool(newPgxpool(t, dsn, "pool_max_conns=8"))
	defer plain.Close()
	lock, look = run(plain)
	pl := headlineLoad(t, holders, hold, duration, lock, look)

	bp99, bn := bl.quantile(0.99)
	pp99, pn := pl.quantile(0.99)
	t.Logf("%s storm (loadavg %s): bridge %d lookups p99 %s max %s; pgx stdlib on pgxpool %d lookups p99 %s max %s; %.0fx",
		name, loadavg(), bn, fmtDur(bp99), fmtDur(bl.max()), pn, fmtDur(pp99), fmtDur(pl.max()),
		float64(pp99)/float64(max(bp99, time.Microsecond)))
	require.Greater(t, bn, 100, "bridge lookups")
	assert.Less(t, bp99, 500*time.Millisecond, "%s on the bridge: lookups waited behind the transactions", name)
	assert.GreaterOrEqual(t, pp99, 500*time.Millisecond, "%s on pgx's stdlib: the storm did not reproduce head-of-line blocking", name)
}

// GORM on the bridge: CRUD, a transaction with a savepoint, prepared-statement mode, a unique
// violation, and db.Connection keeping one session; then the storm beside pgx's stdlib.
func TestGORM(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 1000)
	pool := newLanes(t, dsn, "pool_max_conns=8")
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	for _, prepare := range []bool{false, true} {
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{PrepareStmt: prepare, Logger: logger.Discard})
		require.NoError(t, err)
		db = db.WithContext(ctx)
		base := 2000
		if prepare {
			base = 3000
		}
		require.NoError(t, db.Create(&Item{ID: base, V: 1}).Error)
		var it Item
		require.NoError(t, db.First(&it, base).Error)
		assert.Equal(t, 1, it.V)
		require.NoError(t, db.Model(&it).Update("v", 2).Error)
		err = db.Create(&Item{ID: base, V: 9}).Error
		assert.True(t, isUniqueViolation(err), "unique violation: %v", err)

		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Model(&Item{ID: base}).Update("v", 3).Error; err != nil {
				return err
			}
			if err := tx.SavePoint("sp").Error; err != nil {
				return err
			}
			if err := tx.Model(&Item{ID: base}).Update("v", 4).Error; err != nil {
				return err
			}
			return tx.RollbackTo("sp").Error
		}))
		require.NoError(t, db.First(&it, base).Error)
		assert.Equal(t, 3, it.V, "the savepoint rolled back the second update")
		require.NoError(t, db.Delete(&Item{}, base).Error)

		backends := map[int]bool{}
		stop := sqlChurn(sqlDB) // other traffic takes and returns sessions meanwhile
		require.NoError(t, db.Connection(func(tx *gorm.DB) error {
			for range 10 {
				var pid int
				if err := tx.Raw("select pg_backend_pid()").Scan(&pid).Error; err != nil {
					return err
				}
				backends[pid] = true
				time.Sleep(2 * time.Millisecond)
			}
			return nil
		}))
		stop()
		assert.Len(t, backends, 1, "db.Connection keeps one session")
	}
	lanesIdle(t, pool, "after GORM")

	ormStorm(t, "GORM", dsn, func(sqlDB *sql.DB) (func(context.Context, int) error, func(context.Context, int) error) {
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		return func(ctx context.Context, id int) error {
				return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					var it Item
					if err := tx.Raw("select id, v from items where id = ? for update", id).Scan(&it).Error; err != nil {
						return err
					}
					time.Sleep(1500 * time.Millisecond)
					return nil
				})
			}, func(ctx context.Context, id int) error {
				var it Item
				return db.WithContext(ctx).First(&it, id).Error
			}
	})
}

// bun on the bridge: CRUD, RunInTx, a unique violation; then the storm beside pgx's stdlib.
func TestBun(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 1000)
	pool := newLanes(t, dsn, "pool_max_conns=8")
	db := bun.NewDB(stdlib.OpenDBFromPool(pool), pgdialect.New())
	defer db.Close()

	_, err := db.NewInsert().Model(&Item{ID: 2000, V: 1}).Exec(ctx)
	require.NoError(t, err)
	var it Item
	require.NoError(t, db.NewSelect().Model(&it).Where("id = ?", 2000).Scan(ctx))
	assert.Equal(t, 1, it.V)
	_, err = db.NewInsert().Model(&Item{ID: 2000, V: 9}).Exec(ctx)
	assert.True(t, isUniqueViolation(err), "unique violation: %v", err)
	require.NoError(t, db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		_, err := tx.NewUpdate().Model(&Item{ID: 2000, V: 5}).WherePK().Exec(ctx)
		return err
	}))
	require.NoError(t, db.NewSelect().Model(&it).Where("id = ?", 2000).Scan(ctx))
	assert.Equal(t, 5, it.V)
	_, err = db.NewDelete().Model(&it).WherePK().Exec(ctx)
	require.NoError(t, err)
	lanesIdle(t, pool, "after bun")

	ormStorm(t, "bun", dsn, func(sqlDB *sql.DB) (func(context.Context, int) error, func(context.Context, int) error) {
		db := bun.NewDB(sqlDB, pgdialect.New())
		return func(ctx context.Context, id int) error {
				return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
					var it Item
					if err := tx.NewSelect().Model(&it).Where("id = ?", id).For("update").Scan(ctx); err != nil {
						return err
					}
					time.Sleep(1500 * time.Millisecond)
					return nil
				})
			}, func(ctx context.Context, id int) error {
				var it Item
				return db.NewSelect().Model(&it).Where("id = ?", id).Scan(ctx)
			}
	})
}

// ent's SQL driver (entgo.io/ent/dialect/sql, what ent's generated code runs on) on the bridge:
// the builder's statements, a transaction, a unique violation; then the storm beside pgx's stdlib.
// Generated code is left out: it adds a code generation step and runs the same driver calls.
func TestEnt(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 1000)
	pool := newLanes(t, dsn, "pool_max_conns=8")
	drv := entsql.OpenDB(dialect.Postgres, stdlib.OpenDBFromPool(pool))
	defer drv.Close()

	ins, args := entsql.Dialect(dialect.Postgres).Insert("items").Columns("id", "v").Values(2000, 1).Query()
	require.NoError(t, drv.Exec(ctx, ins, args, nil))
	err := drv.Exec(ctx, ins, args, nil)
	assert.True(t, isUniqueViolation(err), "unique violation: %v", err)
	tx, err := drv.Tx(ctx)
	require.NoError(t, err)
	upd, args := entsql.Dialect(dialect.Postgres).Update("items").Set("v", 7).Where(entsql.EQ("id", 2000)).Query()
	require.NoError(t, tx.Exec(ctx, upd, args, nil))
	require.NoError(t, tx.Commit())
	v, err := entLookup(ctx, drv, 2000)
	require.NoError(t, err)
	assert.Equal(t, 7, v)
	lanesIdle(t, pool, "after ent")

	ormStorm(t, "ent", dsn, func(sqlDB *sql.DB) (func(context.Context, int) error, func(context.Context, int) error) {
		drv := entsql.OpenDB(dialect.Postgres, sqlDB)
		return func(ctx context.Context, id int) error {
				tx, err := drv.Tx(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback() //nolint:errcheck
				sel, args := entsql.Dialect(dialect.Postgres).Select("v").From(entsql.Table("items")).Where(entsql.EQ("id", id)).ForUpdate().Query()
				var rows entsql.Rows
				if err := tx.Query(ctx, sel, args, &rows); err != nil {
					return err
				}
				rows.Close()
				time.Sleep(1500 * time.Millisecond)
				return tx.Commit()
			}, func(ctx context.Context, id int) error {
				_, err := entLookup(ctx, drv, id)
				return err
			}
	})
}

func entLookup(ctx context.Context, drv *entsql.Driver, id int) (int, error) {
	sel, args := entsql.Dialect(dialect.Postgres).Select("v").From(entsql.Table("items")).Where(entsql.EQ("id", id)).Query()
	var rows entsql.Rows
	if err := drv.Query(ctx, sel, args, &rows); err != nil {
		return 0, err
	}
	defer rows.Close()
	if !rows.Next() {
		return 0, sql.ErrNoRows
	}
	var v int
	return v, rows.Scan(&v)
}

// sqlx under the storm beside pgx's stdlib (TestSqlx covers its API on the bridge).
func TestSqlxStorm(t *testing.T) {
	ormStorm(t, "sqlx", newDB(t, 1000), func(sqlDB *sql.DB) (func(context.Context, int) error, func(context.Context, int) error) {
		db := sqlx.NewDb(sqlDB, "pgx")
		return func(ctx context.Context, id int) error {
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback() //nolint:errcheck
				var v int
				if err := tx.GetContext(ctx, &v, "select v from items where id = $1 for update", id); err != nil {
					return err
				}
				time.Sleep(1500 * time.Millisecond)
				return tx.Commit()
			}, func(ctx context.Context, id int) error {
				var v int
				return db.GetContext(ctx, &v, "select v from items where id = $1", id)
			}
	})
}
