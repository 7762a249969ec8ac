package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type emailArgs struct {
	To string `json:"to"`
}

func (emailArgs) Kind() string { return "email" }

// TestRiverInsertOnLaneTransactions: River's driver takes a *pgxpool.Pool, but an insert-only
// client (riverpgxv5.New(nil)) inserts jobs on any pgx.Tx, so jobs are enqueued in the same
// pgxlanes transaction as the business rows. Workers run on a client of their own pool.
func TestRiverInsertOnLaneTransactions(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	migratePool := newPgxpool(t, dsn, "pool_max_conns=2")
	migrator, err := rivermigrate.New(riverpgxv5.New(migratePool), nil)
	require.NoError(t, err)
	_, err = migrator.Migrate(bg, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)

	p := newLanes(t, dsn, "pool_max_conns=4")
	_, err = p.Exec(bg, "create table signups (email text primary key)")
	require.NoError(t, err)
	inserter, err := river.NewClient(riverpgxv5.New(nil), &river.Config{})
	require.NoError(t, err)
	err = pgx.BeginFunc(bg, p, func(tx pgx.Tx) error {
		if _, err := tx.Exec(bg, "insert into signups values ($1)", "a@example.com"); err != nil {
			return err
		}
		_, err := inserter.InsertTx(bg, tx, emailArgs{To: "a@example.com"}, nil)
		return err
	})
	require.NoError(t, err)
	var kind string
	require.NoError(t, p.QueryRow(bg, "select kind from river_job").Scan(&kind))
	assert.Equal(t, "email", kind)
}
