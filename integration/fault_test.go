package integration

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// The fault suite of issue 12: each fault under the mixed load of fault_load_test.go, then the
// invariants. The short forms hurt the server or the link once; with PGXLANES_STRESS=<duration>
// each fault is repeated, load running, until the duration has passed (make stress).

// faultCase is one fault: inject hurts the server or the link while the load runs, and returns
// when the fault is over.
type faultCase struct {
	name    string
	dsn     string // the server, directly: for the table check
	poolDSN string // what the pool connects to (a proxy, or dsn)
	inject  func(t *testing.T)
	closeFn func() // closes what the test started besides the pool, before goleak's check
}

// runFault runs the load, injects the fault once (or until PGXLANES_STRESS has passed),
// measures the recovery each time, and checks the invariants.
func runFault(t *testing.T, fc faultCase) {
	leak := goleak.IgnoreCurrent()
	baseGoroutines := runtime.NumGoroutine()
	createFaultTable(t, fc.dsn)
	cfg, err := pgxlanes.ParseConfig(withParams(fc.poolDSN, faultParams))
	require.NoError(t, err)
	cfg.CancelGrace = time.Second
	p, err := pgxlanes.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)

	l := newFaultLoad(p)
	l.start()
	l.waitAcked(t, 10, 30*time.Second, "the load commits before the fault")
	until := time.Now().Add(stressDuration(t))
	var worstLookup, worstTx time.Duration
	cycles := 0
	for cycles == 0 || time.Now().Before(until) {
		fc.inject(t)
		end := time.Now()
		lookup, tx := l.recovered(t, end)
		worstLookup, worstTx = max(worstLookup, lookup), max(worstTx, tx)
		if cycles == 0 {
			figure(t, "fault_"+fc.name+"_recover_ms", ms(lookup))
			figure(t, "fault_"+fc.name+"_recover_tx_ms", ms(tx))
		}
		l.waitAcked(t, 10, 30*time.Second, "the load commits again after the fault")
		cycles++
	}
	l.stopLoad()
	lanesIdle(t, p, fc.name+" at quiescence")
	inUse := 0
	st := p.Stat()
	for _, ln := range pgxlanes.Lanes() {
		inUse += st.Lane(ln).InUse
	}
	figure(t, "fault_"+fc.name+"_in_use_end", float64(inUse))
	p.Close()
	if fc.closeFn != nil {
		fc.closeFn()
	}
	goleak.VerifyNone(t, leak)
	figure(t, "fault_"+fc.name+"_goroutines_end", float64(runtime.NumGoroutine()-baseGoroutines))
	if cycles > 1 {
		t.Logf("%s: %d cycles; worst recovery: lookup %v, transaction %v", fc.name, cycles, worstLookup, worstTx)
		figure(t, "fault_"+fc.name+"_cycles", float64(cycles))
		figure(t, "fault_"+fc.name+"_recover_worst_ms", ms(worstLookup))
	}
	l.checkCalls(t, fc.name)
	l.checkRows(t, fc.name, fc.dsn)
	l.logKinds(t, fc.name)
}

// TestFaultRestart: the server restarts under load, with pg_ctl stop -m fast (sessions terminated
// with 57P01) and -m immediate (a crash: every backend killed, crash recovery at start). The pool
// replaces its connections by itself. synchronous_commit is on, as in production: with the
// harness's default (off), a crash may lose commits the server acknowledged, which is the
// server's documented trade, not the pool's.
func TestFaultRestart(t *testing.T) {
	srv := pgserver.NewLocal(t, pgserver.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	for _, mode := range []pgserver.StopMode{pgserver.StopFast, pgserver.StopImmediate} {
		t.Run(mode.String(), func(t *testing.T) {
			name := "restart_" + mode.String()
			runFault(t, faultCase{name: name, dsn: srv.DSN(), poolDSN: srv.DSN(), inject: func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				st, err := srv.Restart(ctx, mode)
				require.NoError(t, err)
				t.Logf("%s: server down %v", name, st.Down)
				figure(t, "fault_"+name+"_down_ms", ms(st.Down))
			}})
		})
	}
}

// TestFaultFreeze: the server stops answering (SIGSTOP of the postmaster and every backend) for
// 3 s under load: callers return at their deadlines or acquire timeouts, interrupted
// connections are closed once CancelGrace passes, and the pool serves again once it thaws.
func TestFaultFreeze(t *testing.T) {
	srv := pgserver.NewLocal(t, pgserver.Options{})
	runFault(t, faultCase{name: "freeze", dsn: srv.DSN(), poolDSN: srv.DSN(), inject: func(t *testing.T) {
		require.NoError(t, srv.Freeze())
		defer func() { require.NoError(t, srv.Thaw()) }()
		time.Sleep(3 * time.Second) // the fault's length: the load runs meanwhile
	}})
}

// TestFaultNetwork: a proxy between the pool and the server blackholes both directions for 2 s
// (silence, sockets open: requests in flight hang), then resets every connection with a TCP RST
// mid-query, then carries traffic again.
func TestFaultNetwork(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	proxy := pgserver.NewProxy(t, dsn)
	runFault(t, faultCase{name: "network", dsn: dsn, poolDSN: proxy.DSN(), closeFn: func() { _ = proxy.Close() },
		inject: func(t *testing.T) {
			require.NoError(t, proxy.SetBlackhole(faultproxy.Both, true))
			time.Sleep(2 * time.Second) // the blackhole's length: the load runs meanwhile
			n := proxy.Reset()
			require.NoError(t, proxy.Normal())
			t.Logf("network: %d connections reset after the blackhole", n)
		}})
}

// TestFaultMaxConnections: the server's max_connections (6) is below the pool's size (8): the
// pool's connections beyond it are refused with 53300, which reaches the caller as an
// *AcquireError wrapping the server's error; the pool serves on the connections it has. The
// fault lasts the whole run; "recovery" is the time to the next lookup.
func TestFaultMaxConnections(t *testing.T) {
	srv := pgserver.NewLocal(t, pgserver.Options{MaxConnections: 6})
	runFault(t, faultCase{name: "max_connections", dsn: srv.DSN(), poolDSN: srv.DSN(), inject: func(t *testing.T) {
		time.Sleep(2 * time.Second) // the load runs against the limit
	}})
}

// TestFaultClose: Close with callers queued on the Tx lane and transactions open. The waiters
// get ErrClosed at once; Close returns once the open transactions end; the transactions that
// commit after Close was called are kept, the others rolled back; every call after Close gets
// ErrClosed; nothing leaks.
func TestFaultClose(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	createFaultTable(t, dsn)
	until := time.Now().Add(stressDuration(t))
	cycles := 0
	for cycles == 0 || time.Now().Before(until) {
		closeUnderLoad(t, dsn, cycles)
		cycles++
		if t.Failed() {
			return
		}
	}
	if cycles > 1 {
		figure(t, "fault_close_cycles", float64(cycles))
	}
}

// closeUnderLoad runs one cycle of TestFaultClose: a pool, the load, Close. Only the first cycle
// logs figures.
func closeUnderLoad(t *testing.T, dsn string, cycle int) {
	const name = "close"
	figures := cycle == 0
	leak := goleak.IgnoreCurrent()
	ctx := context.Background()
	p, err := pgxlanes.New(ctx, withParams(dsn, faultParams))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	l := newFaultLoad(p)
	l.quiet = !figures
	l.start()
	l.waitAcked(t, 10, 30*time.Second, "the load commits")

	// Fill the Tx lane with open transactions, each with its rows inserted, so that the load's
	// transactions queue. The Long worker may hold one of the shared connections Tx could reach.
	txCap := p.Stat().Lane(pgxlanes.Tx).MaxConns
	type held struct {
		id int64
		tx interface {
			Commit(context.Context) error
			Rollback(context.Context) error
		}
	}
	var open []held
	for len(open) < txCap {
		id := faultIDs.Add(1)
		tx, err := p.Begin(ctx)
		if errors.Is(err, pgxlanes.ErrAcquireTimeout) && len(open) > 0 {
			break // the load and the Long worker hold the rest of what Tx can reach
		}
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "insert into fault_tx (id, part) values ($1, 1), ($1, 2)", id)
		require.NoError(t, err)
		open = append(open, held{id, tx})
	}
	pgserver.Eventually(t, 10*time.Second, "the load's transactions queue on Tx", func() bool {
		return p.Stat().Lane(pgxlanes.Tx).Waiting > 0
	})
	closed := make(chan time.Time, 1)
	closeStart := time.Now()
	go func() { p.Close(); closed <- time.Now() }()
	pgserver.Eventually(t, 10*time.Second, "the waiters get ErrClosed", func() bool {
		return p.Stat().Lane(pgxlanes.Tx).Waiting == 0 && l.errorKinds()["closed"] > 0
	})
	select {
	case <-closed:
		t.Fatal("Close returned while transactions were open")
	default:
	}
	// Half the open transactions commit after Close was called, the others roll back.
	var lastEnd time.Time
	for i, h := range open {
		if i%2 == 0 {
			err := h.tx.Commit(ctx)
			require.NoError(t, err, "a transaction open when Close was called commits")
			l.outcome(l.acked, h.id)
		} else {
			require.NoError(t, h.tx.Rollback(ctx))
			l.outcome(l.failedBefore, h.id)
		}
		lastEnd = time.Now()
	}
	var closedAt time.Time
	select {
	case closedAt = <-closed:
	case <-time.After(txDeadline + faultSlack):
		t.Fatal("Close did not return after the last transaction ended")
	}
	afterLast := closedAt.Sub(lastEnd)
	l.stopLoad()
	_, err = p.Exec(ctx, "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrClosed)
	_, err = p.Begin(ctx)
	require.ErrorIs(t, err, pgxlanes.ErrClosed)
	st := p.Stat()
	for _, ln := range pgxlanes.Lanes() {
		assert.Zero(t, st.Lane(ln).InUse, "%s in use after Close", ln)
		assert.Zero(t, st.Lane(ln).Waiting, "%s waiting after Close", ln)
	}
	goleak.VerifyNone(t, leak)
	t.Logf("%s, cycle %d: Close took %v, returned %v after the last open transaction ended", name, cycle, closedAt.Sub(closeStart), afterLast)
	if figures {
		figure(t, "fault_"+name+"_return_after_last_tx_ms", ms(afterLast))
	}
	assert.Less(t, afterLast, faultSlack, "Close returns once the held connections are back")
	l.checkCalls(t, name)
	l.checkRows(t, name, dsn)
	l.logKinds(t, name)
}
