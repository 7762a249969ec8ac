package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is the statement-running method set that *Pool, *Conn and *pgxpool.Pool have in common.
// Code that takes a DB runs on pgxlanes, on pgxpool during a rollout, and on a test double: as
// of pgx 5.12 no release of pgxmock builds with pgx 5.11 or later, which pgxlanes needs.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	Ping(ctx context.Context) error
}

var (
	_ DB = (*Pool)(nil)
	_ DB = (*Conn)(nil)
	_ DB = (*pgxpool.Pool)(nil)
)

// PgxpoolView is a view of a Pool for exporters written for pgxpool: it has the Stat and Config
// methods that IBM/pgxpoolprometheus (a Stater) and otelpgx.RecordStats (a PoolStats) take. Its
// figures are those of the pgxpool under the lanes: connections opened, idle, acquired, and its
// own acquire counts and waits. They cannot see the lanes: the wait for a lane slot, per-lane use,
// timeouts, rejections and budget actions. Export those with the metrics packages beside it.
type PgxpoolView struct{ p *Pool }

// PgxpoolView returns the pool's view for pgxpool exporters. Taking one turns parking off (park.go):
// pgxpool's own figures then count every lease's acquire and release, as the exporter expects.
// Take it before the pool serves, as exporters are registered at startup: pgxpool's cumulative
// counts (AcquireCount, AcquireDuration, EmptyAcquireCount) miss the leases served from parked
// connections before the first view. Stat, of this package, counts every lease.
func (p *Pool) PgxpoolView() PgxpoolView {
	for _, srv := range p.servers {
		if srv.parks.Swap(false) {
			srv.park.flush(false, true) // and refuse a lease that read parks before the Swap
		}
	}
	return PgxpoolView{p}
}

// Stat returns the statistics of the pgxpool under the lanes (of the primary, when Long is aimed
// at another server).
func (v PgxpoolView) Stat() *pgxpool.Stat { return v.p.servers[0].pool.Stat() }

// Config returns a copy of the configuration of the pgxpool under the lanes (pgxlanes' hooks and
// startup parameters included).
func (v PgxpoolView) Config() *pgxpool.Config { return v.p.servers[0].pool.Config() }
