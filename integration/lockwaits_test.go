package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestLockWaitsSecondCallerKeepsItsContext: a LockWaits whose query waits on a stalled link
// (the server's replies held by a proxy) holds the one lookup under way, and a second caller
// (another viewer of the status page) waits for it only as long as its own ctx allows: it returns
// with its ctx's error at its deadline, not when the first caller's round trip ends.
func TestLockWaitsSecondCallerKeepsItsContext(t *testing.T) {
	bg := context.Background()
	admin, proxy := behindProxy(t)
	p, err := pgxlanes.New(bg, withParams(proxy.DSN(), "pool_max_conns=4"))
	require.NoError(t, err)
	defer p.Close()
	_, err = p.LockWaits(bg) // opens the guard session
	require.NoError(t, err)
	var since time.Time
	require.NoError(t, admin.QueryRow(bg, "select now()").Scan(&since))
	// A call within a second of the last query gets its answer: let that second pass, so that
	// the first caller below queries the server.
	time.Sleep(1100 * time.Millisecond)

	require.NoError(t, proxy.SetBlackhole(faultproxy.Downstream, true))
	first, cancelFirst := context.WithTimeout(bg, 2*time.Minute)
	defer cancelFirst()
	firstDone := make(chan error, 1)
	go func() {
		_, err := p.LockWaits(first)
		firstDone <- err
	}()
	// The first caller's query reached the server, and its reply is held by the proxy.
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(bg, `select count(*) from pg_stat_activity where application_name = 'pgxlanes guard'
			and query like '%pg_blocking_pids%' and query_start > $1`, since).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the first LockWaits reached the server")

	second, cancelSecond := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancelSecond()
	start := time.Now()
	secondDone := make(chan error, 1)
	go func() {
		_, err := p.LockWaits(second)
		secondDone <- err
	}()
	select {
	case err := <-secondDone:
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		t.Logf("the second LockWaits returned after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		require.NoError(t, proxy.Normal())
		<-secondDone
		t.Fatalf("the second LockWaits waited %v, past its own 300 ms deadline, for the first one's round trip", time.Since(start).Round(time.Millisecond))
	}
	cancelFirst()
	select {
	case err := <-firstDone:
		assert.Error(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the first LockWaits did not return after its ctx ended")
	}
}
