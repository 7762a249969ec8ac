package integration

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// This file holds what the PgBouncer tests share: a PgBouncer per test, driven through its admin
// console. The tests themselves are in pgbouncer_*_test.go. The installed PgBouncer is Debian 12's
// 1.18, which can crash on a protocol cancel request (pgbouncer/pgbouncer#801, fixed in 1.19.1,
// and #822/#904, fixed in 1.21.0): every pool here sets pgxlanes_cancel_requests=false, and a
// test that could make a cancel reach PgBouncer says so.

// bouncer is a PgBouncer started for one test, in front of the test's database.
type bouncer struct {
	mode  string // pool_mode: session or transaction
	dsn   string // the test's database, through PgBouncer
	admin string // PgBouncer's admin console (simple protocol only)
}

// startBouncer starts PgBouncer in pool mode mode in front of the database of upstream, stopped
// when t ends, then applies settings ("name=value") through the admin console's SET, which takes
// effect at once for the settings used here.
func startBouncer(t testing.TB, upstream, mode string, settings ...string) *bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, stop, err := pgserver.StartPgBouncer(ctx, upstream, mode)
	require.NoError(t, err)
	t.Cleanup(stop)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Path = "/pgbouncer"
	b := &bouncer{mode: mode, dsn: dsn, admin: withParams(u.String(), "default_query_exec_mode=simple_protocol")}
	for _, s := range settings {
		name, value, ok := strings.Cut(s, "=")
		require.True(t, ok, "setting %q is not name=value", s)
		b.set(t, name, value)
	}
	return b
}

// console runs f on a fresh admin console connection, all of it bounded by a few seconds: a
// PgBouncer that crashed refuses the connection at once, one that hangs times out.
func (b *bouncer) console(f func(ctx context.Context, c *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, b.admin)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return f(ctx, c)
}

// set changes a PgBouncer setting at run time.
func (b *bouncer) set(t testing.TB, name, value string) {
	t.Helper()
	require.NoError(t, b.console(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, fmt.Sprintf("set %s = '%s'", name, value))
		return err
	}), "pgbouncer: set %s", name)
}

// alive reports whether PgBouncer still answers on its admin console: a crash (#801) shows here.
func (b *bouncer) alive() error {
	return b.console(func(ctx context.Context, c *pgx.Conn) error {
		var v string
		return c.QueryRow(ctx, "show version").Scan(&v)
	})
}

// poolStats is a row of SHOW POOLS: client connections active (linked to a server) and waiting
// for one, server connections active and idle, and the oldest client's wait.
type poolStats struct {
	clActive, clWaiting, svActive, svIdle int
	maxWait                               time.Duration
}

// pool returns SHOW POOLS for the test's database.
func (b *bouncer) pool(t testing.TB) poolStats {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.dsn)
	require.NoError(t, err)
	var ps poolStats
	require.NoError(t, b.console(func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, "show pools")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			// The admin console speaks text: read the raw values by column name.
			m := map[string]string{}
			for i, fd := range rows.FieldDescriptions() {
				m[fd.Name] = string(rows.RawValues()[i])
			}
			if m["database"] != cfg.Database {
				continue
			}
			num := func(k string) int {
				n, _ := strconv.Atoi(m[k])
				return n
			}
			ps = poolStats{clActive: num("cl_active"), clWaiting: num("cl_waiting"), svActive: num("sv_active"),
				svIdle: num("sv_idle"), maxWait: time.Duration(num("maxwait"))*time.Second + time.Duration(num("maxwait_us"))*time.Microsecond}
		}
		return rows.Err()
	}))
	return ps
}

// requireAlive fails t if PgBouncer no longer answers.
func (b *bouncer) requireAlive(t testing.TB, when string) {
	t.Helper()
	require.NoError(t, b.alive(), "%s: PgBouncer %s mode no longer answers (crashed?)", when, b.mode)
}

// bouncerParams are the pgxlanes DSN parameters a pool behind PgBouncer 1.18 needs in mode: in
// transaction mode pgxlanes_transaction_pooler and an exec mode without named prepared
// statements; in both modes no protocol cancel requests.
func bouncerParams(mode string) string {
	p := "pgxlanes_cancel_requests=false"
	if mode == "transaction" {
		p += "&pgxlanes_transaction_pooler=true&default_query_exec_mode=cache_describe"
	}
	return p
}

// sessionModeDefaults prepares a database for a pgxlanes pool behind PgBouncer in session mode.
// PgBouncer refuses the statement_timeout and lock_timeout startup parameters by which pgxlanes
// gives every session Short's timeouts, unless they are in ignore_startup_parameters, and then it
// drops them. So the database (in production: the role, ALTER ROLE ... SET) carries Short's
// timeouts as its defaults, which is also what RESET returns to after a lease of another lane.
func sessionModeDefaults(t testing.TB, b *bouncer, upstream string) {
	t.Helper()
	b.set(t, "ignore_startup_parameters", "extra_float_digits,statement_timeout,lock_timeout")
	b.alterDatabase(t, upstream, "statement_timeout = '5s'", "lock_timeout = '1s'")
}

// alterDatabase gives the database of upstream the settings ("name = value") as its defaults. A
// server session reads them when it starts: PgBouncer's RECONNECT retires the older ones.
func (b *bouncer) alterDatabase(t testing.TB, upstream string, settings ...string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, upstream)
	require.NoError(t, err)
	defer c.Close(ctx)
	for _, s := range settings {
		_, err := c.Exec(ctx, "alter database "+pgx.Identifier{c.Config().Database}.Sanitize()+" set "+s)
		require.NoError(t, err)
	}
	require.NoError(t, b.console(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "reconnect")
		return err
	}))
}
