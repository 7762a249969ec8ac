package integration

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The connection underneath (internal/wire) at a deadline, beside plain pgxpool: a deadline that
// ends while the connection is still being cleaned, a COPY whose source stalls, a pipeline with
// several Syncs (issue 19, cases 1 to 3; case 4, the error's identity, is asserted here and on
// every path in deadline_test.go).

// stubbornSQL creates stubborn(), a statement slow to obey a cancel: it catches it and sleeps
// 400 ms more, then ends without an error.
const stubbornSQL = `create function stubborn() returns void language plpgsql as $$
	begin perform pg_sleep(1); exception when query_canceled then perform pg_sleep(0.4); end $$`

// requireDeadlineError asserts the identity a deadline's error has (issue 19, case 4).
func requireDeadlineError(t *testing.T, err error, want57014 bool) {
	t.Helper()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, pgconn.Timeout(err), "pgconn.Timeout: %v", err)
	if want57014 {
		var pgErr *pgconn.PgError
		if assert.ErrorAs(t, err, &pgErr, "57014 reachable: %v", err) {
			assert.Equal(t, "57014", pgErr.Code)
		}
	}
}

// Case 1: on a held connection, a statement under a 20 ms deadline, then at once a second one
// under its own deadline while the first is still being cleaned. The second returns at its
// deadline with its context's error, never later and never with a success it did not have; the
// session is kept. pgxpool: the first deadline closed the connection, the second call fails at
// once with "conn closed".
func TestDeadlineDuringDrain(t *testing.T) {
	const runs = 5
	bg := context.Background()
	dsnL, dsnP := newDB(t, 1), newDB(t, 1)
	lanes := newLanes(t, dsnL, "pool_max_conns=4")
	plain := newPgxpool(t, dsnP, "pool_max_conns=4")
	for _, dsn := range []string{dsnL, dsnP} {
		c, err := pgx.Connect(bg, dsn)
		require.NoError(t, err)
		_, err = c.Exec(bg, stubbornSQL)
		require.NoError(t, err)
		require.NoError(t, c.Close(bg))
	}
	cases := []struct {
		name   string
		first  string
		second time.Duration
	}{
		{"second deadline 100ms", "select pg_sleep(1)", 100 * time.Millisecond},
		{"second deadline 5ms", "select pg_sleep(1)", 5 * time.Millisecond},
		{"second deadline 100ms, first slow to obey the cancel", "select stubborn()", 100 * time.Millisecond},
	}
	run := func(t *testing.T, c heldConn, first string, second time.Duration) (time.Duration, error) {
		ctx1, cancel1 := context.WithTimeout(bg, 20*time.Millisecond)
		_, err := c.Exec(ctx1, first)
		cancel1()
		require.Error(t, err)
		ctx2, cancel2 := context.WithTimeout(bg, second)
		defer cancel2()
		start := time.Now()
		_, err = c.Exec(ctx2, "select pg_sleep(2)")
		return time.Since(start), err
	}
	beforeL, beforeP := sessions(t, dsnL), sessions(t, dsnP)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tookL, tookP []time.Duration
			var errP error
			for range runs {
				c, err := lanes.Acquire(bg)
				require.NoError(t, err)
				var pid, pidAfter uint32
				require.NoError(t, c.QueryRow(bg, "select pg_backend_pid()").Scan(&pid))
				took, err := run(t, c, tc.first, tc.second)
				tookL = append(tookL, took)
				require.Error(t, err, "the second statement reported success after %v", took)
				requireDeadlineError(t, err, tc.second > 50*time.Millisecond)
				assert.Less(t, took, tc.second+400*time.Millisecond, "the second deadline was lost in the drain")
				// The session is kept: the same backend serves the next statement.
				require.NoError(t, c.QueryRow(bg, "select pg_backend_pid()").Scan(&pidAfter))
				assert.Equal(t, pid, pidAfter)
				c.Release()

				pc, err := plain.Acquire(bg)
				require.NoError(t, err)
				took, errP = run(t, pc, tc.first, tc.second)
				tookP = append(tookP, took)
				pc.Release()
			}
			t.Logf("%s: the second call returned after, median of %d: pgxlanes %v (%v-%v), pgxpool %v (%v-%v, %v); load %s",
				tc.name, runs, fmtDur(median(tookL)), fmtDur(slices.Min(tookL)), fmtDur(slices.Max(tookL)),
				fmtDur(median(tookP)), fmtDur(slices.Min(tookP)), fmtDur(slices.Max(tookP)), errP, loadavg())
			figure(t, "wire.drain_deadline."+slug(tc.name)+".pgxlanes_ms", ms(median(tookL)))
			figure(t, "wire.drain_deadline."+slug(tc.name)+".pgxpool_ms", ms(median(tookP)))
		})
	}
	lanesIdle(t, lanes, "after the deadlines during drains")
	newL, newP := sessions(t, dsnL)-beforeL, sessions(t, dsnP)-beforeP
	t.Logf("new server sessions over %d pairs of deadlines: pgxlanes %d, pgxpool %d", runs*len(cases), newL, newP)
	// A released connection is cleaned before it is reused, so the next Acquire may open another
	// one meanwhile; what matters is that no deadline costs its session.
	assert.LessOrEqual(t, newL, int64(3), "pgxlanes kept its sessions")
	assert.GreaterOrEqual(t, newP, int64(runs*len(cases)/2), "pgxpool closes a connection per deadline: the comparison did not reproduce")
}

// stallingSource yields n rows, then blocks for stall before the rest, as a source reading from
// a slow upstream does; its Next does not watch the ctx.
type stallingSource struct {
	n, i    int
	stall   time.Duration
	stalled atomic.Bool // it reached the stall: the deadline met the COPY itself
}

func (s *stallingSource) Next() bool {
	if s.i == s.n {
		s.stalled.Store(true)
		time.Sleep(s.stall)
	}
	s.i++
	return s.i <= 2*s.n
}
func (s *stallingSource) Values() ([]any, error) { return []any{s.i}, nil }
func (s *stallingSource) Err() error             { return nil }

// Case 2: CopyFrom under a 100 ms deadline whose source stalls after 10 rows. pgx waits for the
// source to return in both pools; pgxlanes must not return later than pgxpool, and it keeps the
// session: the server, which acts on a cancel during COPY FROM STDIN only when data arrives, gets
// a CopyFail at the deadline.
func TestCopyFromStalledSource(t *testing.T) {
	bg := context.Background()
	dsnL, dsnP := newDB(t, 1), newDB(t, 1)
	lanes := newLanes(t, dsnL, "pool_max_conns=4")
	plain := newPgxpool(t, dsnP, "pool_max_conns=4")
	for _, dsn := range []string{dsnL, dsnP} {
		c, err := pgx.Connect(bg, dsn)
		require.NoError(t, err)
		_, err = c.Exec(bg, "create table sink (id int)")
		require.NoError(t, err)
		require.NoError(t, c.Close(bg))
	}
	// Warm both pools (a connection, pgx's description of the table), so that the deadline meets
	// the COPY itself.
	for _, f := range []func(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error){lanes.CopyFrom, plain.CopyFrom} {
		_, err := f(bg, pgx.Identifier{"sink"}, []string{"id"}, pgx.CopyFromRows(nil))
		require.NoError(t, err)
	}
	beforeL := sessions(t, dsnL)
	for _, tc := range []struct {
		stall time.Duration
		runs  int
	}{{time.Second, 3}, {3 * time.Second, 1}} {
		var tookL, tookP []time.Duration
		for range tc.runs {
			copyFrom := func(f func(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error)) (time.Duration, bool, error) {
				ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
				defer cancel()
				src := &stallingSource{n: 10, stall: tc.stall}
				start := time.Now()
				_, err := f(ctx, pgx.Identifier{"sink"}, []string{"id"}, src)
				return time.Since(start), src.stalled.Load(), err
			}
			took, stalled, errL := copyFrom(lanes.CopyFrom)
			require.True(t, stalled, "pgxlanes's deadline came before the COPY")
			tookL = append(tookL, took)
			requireDeadlineError(t, errL, true)
			// pgxpool closed its connection at the last deadline: warm the next one, so that this
			// deadline too meets the COPY, not the dial or pgx's description of the table.
			_, err := plain.CopyFrom(bg, pgx.Identifier{"sink"}, []string{"id"}, pgx.CopyFromRows(nil))
			require.NoError(t, err)
			took, stalled, errP := copyFrom(plain.CopyFrom)
			if !stalled {
				t.Logf("pgxpool's deadline came before its COPY (%v after %v): not compared", errP, fmtDur(took))
				continue
			}
			tookP = append(tookP, took)
			t.Logf("stall %v: pgxlanes %v (%v), pgxpool %v (%v)", tc.stall, fmtDur(tookL[len(tookL)-1]), errL, fmtDur(took), errP)
			assert.Less(t, tookL[len(tookL)-1], took+150*time.Millisecond, "pgxlanes returned later than pgxpool")
		}
		if len(tookP) == 0 {
			continue
		}
		t.Logf("CopyFrom, source stalled %v, 100 ms deadline, median of %d: pgxlanes %v, pgxpool %v; load %s",
			tc.stall, tc.runs, fmtDur(median(tookL)), fmtDur(median(tookP)), loadavg())
		figure(t, fmt.Sprintf("wire.copy_stall_%ds.pgxlanes_ms", int(tc.stall.Seconds())), ms(median(tookL)))
		figure(t, fmt.Sprintf("wire.copy_stall_%ds.pgxpool_ms", int(tc.stall.Seconds())), ms(median(tookP)))
	}
	lanesIdle(t, lanes, "after the COPYs")
	var rows int
	require.NoError(t, lanes.QueryRow(bg, "select count(*) from sink").Scan(&rows))
	assert.Zero(t, rows, "a COPY cut by its deadline committed rows")
	assert.Zero(t, sessions(t, dsnL)-beforeL, "pgxlanes kept its sessions")
}

// Case 3: a pipeline with two Syncs in flight on a held connection's PgConn. The deadline returns
// on time with an error for which pgconn.Timeout and errors.Is(err, DeadlineExceeded) hold, as
// with pgxpool; the connection is closed (a synthetic 57014 could keep it, but the raw pipeline
// API could not tell it from the server's), and the lane's slot comes back.
func TestPipelineSeveralSyncsAtDeadline(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	lanes := newLanes(t, dsn, "pool_max_conns=4")
	plain := newPgxpool(t, dsn, "pool_max_conns=4")
	pipeline := func(pc *pgconn.PgConn) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		p := pc.StartPipeline(ctx)
		p.SendQueryParams("select pg_sleep(1)", nil, nil, nil, nil)
		p.SendPipelineSync()
		p.SendQueryParams("select 2", nil, nil, nil, nil)
		p.SendPipelineSync()
		err := p.Flush()
		for err == nil {
			var res any
			res, err = p.GetResults()
			if rr, ok := res.(*pgconn.ResultReader); ok {
				_, err = rr.Close()
			}
			if res == nil && err == nil {
				break
			}
		}
		took := time.Since(start)
		_ = p.Close()
		return took, err
	}
	c, err := lanes.Acquire(bg)
	require.NoError(t, err)
	tookL, errL := pipeline(c.Conn().PgConn())
	closedL := c.Conn().PgConn().IsClosed()
	c.Release()
	pc, err := plain.Acquire(bg)
	require.NoError(t, err)
	tookP, errP := pipeline(pc.Conn().PgConn())
	closedP := pc.Conn().PgConn().IsClosed()
	pc.Release()
	t.Logf("pipeline, two Syncs, 100 ms deadline: pgxlanes %v (%v, closed %v), pgxpool %v (%v, closed %v); load %s",
		fmtDur(tookL), errL, closedL, fmtDur(tookP), errP, closedP, loadavg())
	requireDeadlineError(t, errL, false)
	requireDeadlineError(t, errP, false)
	assert.Less(t, tookL, 500*time.Millisecond)
	assert.True(t, closedL, "documented: a pipeline with several Syncs closes the connection")
	lanesIdle(t, lanes, "after the pipeline")
	require.NoError(t, lanes.Ping(bg))
}

// slug turns a case name into a figure name.
func slug(s string) string {
	var b []byte
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b = append(b, byte(r))
		case len(b) > 0 && b[len(b)-1] != '_':
			b = append(b, '_')
		}
	}
	for len(b) > 0 && b[len(b)-1] == '_' {
		b = b[:len(b)-1]
	}
	return string(b)
}
