package pgxlanestest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/pgxlanestest"
)

// Accounts is the service under test: a balance lookup and a transfer, over HTTP.
type Accounts struct{ DB *pgxlanes.Pool }

// Balance is a lookup: one query by primary key, in the Short lane.
func (a *Accounts) Balance(ctx context.Context, id int) (int64, error) {
	var balance int64
	err := a.DB.QueryRow(ctx, "select balance from accounts where id = $1", id).Scan(&balance)
	return balance, err
}

// Transfer is a transaction that locks both accounts' rows, in the Tx lane.
func (a *Accounts) Transfer(ctx context.Context, from, to int, amount int64) error {
	return pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "update accounts set balance = balance - $2 where id = $1", from, amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "update accounts set balance = balance + $2 where id = $1", to, amount)
		return err
	})
}

// ServeHTTP serves GET /balance?id=1 and POST /transfer?from=1&to=2&amount=10. A pool that gives
// no connection in time is a 503, so that clients back off.
func (a *Accounts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	arg := func(name string) int { n, _ := strconv.Atoi(q.Get(name)); return n }
	var err error
	switch r.URL.Path {
	case "/balance":
		var b int64
		if b, err = a.Balance(r.Context(), arg("id")); err == nil {
			fmt.Fprintln(w, b)
		}
	case "/transfer":
		err = a.Transfer(r.Context(), arg("from"), arg("to"), int64(arg("amount")))
	default:
		http.NotFound(w, r)
		return
	}
	switch {
	case errors.Is(err, pgxlanes.ErrAcquireTimeout), errors.Is(err, pgxlanes.ErrLaneFull):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

const accountsSchema = `create table accounts (id int primary key, balance bigint not null);
	insert into accounts select g, 100 from generate_series(1, 10) g`

// lookupsStayFastDuringTransferStorm is the test. In the service's own _test.go file it is
// called TestLookupsStayFastDuringTransferStorm.
func lookupsStayFastDuringTransferStorm(t *testing.T) {
	pool := pgxlanestest.NewPool(t,
		pgxlanestest.WithDSNParams("pool_max_conns=8&lane_tx_acquire_timeout=250ms"),
		pgxlanestest.WithSchema(accountsSchema))
	srv := httptest.NewServer(&Accounts{DB: pool})
	defer srv.Close()
	client := &http.Client{Timeout: time.Second}
	call := func(method, path string) (int, string) {
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err) // a lookup that queued behind the storm would time out here
		defer resp.Body.Close()
		var body string
		_, _ = fmt.Fscan(resp.Body, &body)
		return resp.StatusCode, body
	}

	// The storm: as many transactions as the Tx lane holds sit on account 1 for up to 10 s.
	// With plain pgxpool they would take the whole pool, and every lookup would wait for them.
	storm := pgxlanestest.HoldLocks(t, pool, pool.Stat().Lane(pgxlanes.Tx).MaxConns, 10*time.Second,
		"accounts", "id = $1", 1)

	for id := 1; id <= 10; id++ {
		code, body := call("GET", fmt.Sprintf("/balance?id=%d", id))
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "100", body)
	}
	assert.Zero(t, pool.Stat().Lane(pgxlanes.Short).EmptyAcquires, "no lookup waited for a connection")

	// A transfer fails fast instead of queueing behind the storm...
	code, _ := call("POST", "/transfer?from=2&to=3&amount=10")
	assert.Equal(t, http.StatusServiceUnavailable, code)

	// ...and goes through once the storm is over.
	storm.Stop()
	code, body := call("POST", "/transfer?from=2&to=3&amount=10")
	assert.Equal(t, http.StatusOK, code, body)
	_, body = call("GET", "/balance?id=3")
	assert.Equal(t, "110", body)
}

// A service test, as a whole file: lookups stay fast while a storm of transactions holds the
// pool's Tx lane and a hot row, and transfers fail fast instead of queueing. In the service's own
// _test.go file, lookupsStayFastDuringTransferStorm is TestLookupsStayFastDuringTransferStorm (an
// example file may hold no Test function; this package runs it as TestExample).
func Example() {}
