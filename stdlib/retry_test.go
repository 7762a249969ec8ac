package stdlib_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // pgx's own database/sql driver, "pgx", for the side-by-side run
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// retryEvents counts a pool's retry events.
type retryEvents struct {
	mu     sync.Mutex
	events []pgxlanes.RetryEvent
}

func (r *retryEvents) ObserveAcquire(pgxlanes.AcquireEvent) {}
func (r *retryEvents) ObserveRelease(pgxlanes.ReleaseEvent) {}
func (r *retryEvents) ObserveRetry(e pgxlanes.RetryEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *retryEvents) count(o pgxlanes.RetryOutcome, code string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Outcome == o && (code == "" || e.Code == code) {
			n++
		}
	}
	return n
}

const bank = `
create table accounts (id int primary key, balance bigint not null);
create table transfers (key text primary key, src int not null, dst int not null, amount bigint not null);
insert into accounts select g, 1000000 from generate_series(1, 3) g;
`

// sqlTransfer moves amount from src to dst once per key: a second call with the key changes nothing.
func sqlTransfer(ctx context.Context, tx *sql.Tx, key string, src, dst int, amount int64) error {
	res, err := tx.ExecContext(ctx, `insert into transfers values ($1, $2, $3, $4) on conflict (key) do nothing`, key, src, dst, amount)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err // applied already
	}
	var bal int64
	if err := tx.QueryRowContext(ctx, `select balance from accounts where id = $1`, src).Scan(&bal); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `update accounts set balance = $2 where id = $1`, src, bal-amount); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `update accounts set balance = balance + $2 where id = $1`, dst, amount)
	return err
}

// checkLedger checks that the money is conserved and that the transfers done are exactly the
// ledger's rows.
func checkLedger(t *testing.T, db *sql.DB, done map[string]bool) {
	t.Helper()
	var total int64
	require.NoError(t, db.QueryRow(`select sum(balance) from accounts`).Scan(&total))
	assert.Equal(t, int64(3_000_000), total, "money conserved")
	rows, err := db.Query(`select key from transfers`)
	require.NoError(t, err)
	ledger := map[string]bool{}
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		ledger[k] = true
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, done, ledger, "0 lost, 0 phantom transfers")
	var drift int64
	require.NoError(t, db.QueryRow(`
		select coalesce(sum(abs(a.balance - (1000000
			- coalesce((select sum(amount) from transfers where src = a.id), 0)
			+ coalesce((select sum(amount) from transfers where dst = a.id), 0)))), 0)
		from accounts a`).Scan(&drift))
	assert.Zero(t, drift, "every balance is what the ledger says: no transfer applied twice")
}

// runSQLTransfers runs n SERIALIZABLE transfers among 3 accounts from 6 callers through
// stdlib.RetryTxWith on db and returns the keys that were reported done.
func runSQLTransfers(t *testing.T, db *sql.DB, n int) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := pgxlanes.RetryOptions{MaxAttempts: 25}
	var mu sync.Mutex
	done := map[string]bool{}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := w; i < n; i += 6 {
				key := fmt.Sprint("k", i)
				err := stdlib.RetryTxWith(ctx, db, o, &sql.TxOptions{Isolation: sql.LevelSerializable}, func(tx *sql.Tx) error {
					// The transfers go round the three accounts, so lock cycles are common: detect
					// them in 50 ms rather than the default second, which a loaded machine turns
					// into minutes.
					if _, err := tx.ExecContext(ctx, "set local deadlock_timeout = '50ms'"); err != nil {
						return err
					}
					return sqlTransfer(ctx, tx, key, 1+i%3, 1+(i+1)%3, int64(1+i%50))
				})
				switch {
				case err == nil:
					mu.Lock()
					done[key] = true
					mu.Unlock()
				case errors.Is(err, pgxlanes.ErrRetryGaveUp):
					var pe *pgconn.PgError
					assert.ErrorAs(t, err, &pe)
				default:
					t.Errorf("transfer %s: %v", key, err)
				}
			}
		})
	}
	wg.Wait()
	return done
}

// TestRetryTxSerializable: concurrent SERIALIZABLE transfers through database/sql on a pool:
// 40001 is retried, the money is conserved, no transfer is lost or doubled; the same on pgx's own
// database/sql driver, beside it.
func TestRetryTxSerializable(t *testing.T) {
	t.Run("pgxlanes", func(t *testing.T) {
		pool, db := open(t, "pool_max_conns=8")
		_, err := db.Exec(bank)
		require.NoError(t, err)
		events := &retryEvents{}
		pool.AddObserver(events)
		done := runSQLTransfers(t, db, 120)
		checkLedger(t, db, done)
		t.Logf("%d done of 120; retries of 40001: %d, gave up: %d", len(done), events.count(pgxlanes.RetryWillRetry, "40001"),
			events.count(pgxlanes.RetryGaveUp, ""))
		assert.Positive(t, events.count(pgxlanes.RetryWillRetry, "40001"), "40001 happened and was retried")
		assert.Equal(t, len(done), events.count(pgxlanes.RetryCommitted, ""))
		for _, e := range events.events {
			assert.Equal(t, pgxlanes.Tx, e.Lane)
		}
		lanesIdle(t, pool)
	})
	t.Run("pgx stdlib", func(t *testing.T) {
		db, err := sql.Open("pgx", pgserver.NewDatabase(t))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		_, err = db.Exec(bank)
		require.NoError(t, err)
		done := runSQLTransfers(t, db, 120)
		checkLedger(t, db, done)
		t.Logf("%d done of 120", len(done))
	})
}

// The attempts are reported on the lane the transactions take: the connector's pinned lane, or
// the one ctx names, with ctx's tag.
func TestRetryTxReportsLane(t *testing.T) {
	pool, db := open(t, "pool_max_conns=4", stdlib.OptionPinLane(pgxlanes.Long))
	events := &retryEvents{}
	pool.AddObserver(events)
	ctx := pgxlanes.WithTag(context.Background(), "report")
	before := lane(pool, pgxlanes.Long).Acquires
	tries := 0
	err := stdlib.RetryTx(ctx, db, nil, func(tx *sql.Tx) error {
		tries++
		if tries == 1 {
			// A real deadlock_detected from the server, raised by the transaction itself.
			_, err := tx.Exec(`do $$ begin raise exception using errcode = '40P01', message = 'test deadlock'; end $$`)
			return err
		}
		_, err := tx.Exec(`select 1`)
		return err
	})
	require.NoError(t, err)
	assert.Equal(t, 2, tries)
	require.Len(t, events.events, 2)
	for _, e := range events.events {
		assert.Equal(t, pgxlanes.Long, e.Lane)
		assert.Equal(t, "report", e.Tag)
	}
	assert.Equal(t, "40P01", events.events[0].Code)
	assert.Equal(t, before+2, lane(pool, pgxlanes.Long).Acquires, "each attempt is a lease of its own")
}

// TestRetryTxCommitUnknown: the connection is lost while COMMIT is in flight, after the server
// committed: RetryTx returns ErrRetryCommitUnknown after one attempt, and the transfer is applied
// once. The COMMIT is RetryTx's own, or fn's (fn commits and returns Commit's error).
func TestRetryTxCommitUnknown(t *testing.T) {
	for _, fnCommits := range []bool{false, true} {
		t.Run(fmt.Sprintf("fn commits %v", fnCommits), func(t *testing.T) {
			dsn := pgserver.NewDatabase(t)
			proxy := pgserver.NewProxy(t, dsn)
			pool, err := pgxlanes.New(context.Background(), withParams(proxy.DSN(), "pool_max_conns=4"))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { _ = db.Close() })
			_, err = db.Exec(bank)
			require.NoError(t, err)
			ctx := context.Background()
			tries := 0
			err = stdlib.RetryTx(ctx, db, nil, func(tx *sql.Tx) error {
				tries++
				if err := sqlTransfer(ctx, tx, "once", 1, 2, 10); err != nil {
					return err
				}
				require.NoError(t, proxy.SetBlackhole(faultproxy.Downstream, true))
				time.AfterFunc(300*time.Millisecond, func() { proxy.Reset(); _ = proxy.Normal() })
				if fnCommits {
					return tx.Commit()
				}
				return nil
			})
			t.Logf("%v after %d attempt(s)", err, tries)
			require.ErrorIs(t, err, pgxlanes.ErrRetryCommitUnknown)
			assert.Equal(t, 1, tries, "never retried")
			checkLedger(t, db, map[string]bool{"once": true})
		})
	}
}
