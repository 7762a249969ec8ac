package integration

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// This file tests what pgxlanes keeps of pgx beneath it, against a server set up as real services
// are: TLS with a CA made at run time, SCRAM-only hostssl pg_hba, a login role whose password is a
// token that changes. Each comparison runs plain pgxpool beside pgxlanes.

// tlsServer starts a server with TLS and SCRAM over TLS only, for one test.
func tlsServer(t *testing.T) *pgserver.Server {
	t.Helper()
	return pgserver.NewLocal(t, pgserver.Options{TLS: true, HostSSLOnly: true, MaxConnections: 60})
}

// setParam returns the URL dsn with the query parameter name set to v.
func setParam(t *testing.T, dsn, name, v string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set(name, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// bothPools opens pgxpool and pgxlanes on dsn and runs one statement on each; it returns the two
// errors, which the caller compares.
func bothPools(t *testing.T, dsn string, opt func(*pgxpool.Config)) (pgxpoolErr, lanesErr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pc, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	if opt != nil {
		opt(pc)
	}
	pp, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pp.Close()
	var one int
	pgxpoolErr = pp.QueryRow(ctx, "select 1").Scan(&one)

	lc, err := pgxlanes.ParseConfig(dsn)
	require.NoError(t, err)
	if opt != nil {
		opt(lc.Config)
	}
	lp, err := pgxlanes.NewWithConfig(ctx, lc)
	require.NoError(t, err)
	defer lp.Close()
	lanesErr = lp.QueryRow(ctx, "select 1").Scan(&one)
	return pgxpoolErr, lanesErr
}

// TestChannelBindingRequire: channel_binding=require connects through pgxlanes as through
// pgxpool, for the lanes' connections and the guard session, over TLS with SCRAM. pgxlanes used to
// fail it: its wrapper hid the *tls.Conn that pgconn binds the login to.
func TestChannelBindingRequire(t *testing.T) {
	s := tlsServer(t)
	dsn := setParam(t, s.DSN(), "channel_binding", "require")
	perr, lerr := bothPools(t, dsn, nil)
	require.NoError(t, perr, "pgxpool")
	require.NoError(t, lerr, "pgxlanes")

	// The guard's session binds too: a transaction over its budget is terminated through it.
	p := newTerminatingPool(t, dsn, nil)
	assertGuardTerminates(t, p)
	var guardTLS bool
	require.NoError(t, p.QueryRow(context.Background(), `select bool_and(s.ssl) from pg_stat_activity a join pg_stat_ssl s using (pid)
		where a.application_name = 'pgxlanes guard'`).Scan(&guardTLS))
	assert.True(t, guardTLS, "the guard session is over TLS")
}

// violations collects a pool's budget violations.
type guardViolations struct {
	mu sync.Mutex
	v  []pgxlanes.Violation
}

func (vs *guardViolations) add(v pgxlanes.Violation) {
	vs.mu.Lock()
	vs.v = append(vs.v, v)
	vs.mu.Unlock()
}

func (vs *guardViolations) terminates() []pgxlanes.Violation {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	var out []pgxlanes.Violation
	for _, v := range vs.v {
		if v.Action == pgxlanes.ActionTerminate {
			out = append(out, v)
		}
	}
	return out
}

// newTerminatingPool opens a pgxlanes pool on dsn whose Tx lane terminates a transaction held
// past 300ms; mod may change its configuration.
func newTerminatingPool(t *testing.T, dsn string, mod func(*pgxlanes.Config)) *terminatingPool {
	t.Helper()
	cfg, err := pgxlanes.ParseConfig(withParams(dsn, "pool_max_conns=4&lane_tx_budget=300ms&lane_tx_over_budget=terminate"))
	require.NoError(t, err)
	tp := &terminatingPool{}
	cfg.OnViolation = tp.vs.add
	if mod != nil {
		mod(cfg)
	}
	tp.Pool, err = pgxlanes.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(tp.Close)
	return tp
}

type terminatingPool struct {
	*pgxlanes.Pool
	vs guardViolations
}

// assertGuardTerminates holds a transaction idle past its budget and checks that the guard
// terminated it, verified (Violation.Err nil): the guard session opened and worked.
func assertGuardTerminates(t *testing.T, p *terminatingPool) {
	t.Helper()
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "select 1")
	require.NoError(t, err)
	pgserver.Eventually(t, 10*time.Second, "the guard acted on the transaction", func() bool { return len(p.vs.terminates()) > 0 })
	_ = tx.Rollback(ctx)
	term := p.vs.terminates()
	require.Len(t, term, 1)
	assert.NoError(t, term[0].Err, "the terminate went through the guard session")
}

// interceptor is a TLS interceptor between a client and the server: it answers the client's
// SSLRequest with a certificate of its own (another CA's), opens its own TLS session to the
// server, and relays the plaintext. A client that does not verify the server (sslmode=require)
// cannot tell, unless SCRAM binds the login to the TLS session: then the server refuses it.
type interceptor struct {
	ln     net.Listener
	cert   tls.Certificate
	server string
	wg     sync.WaitGroup
}

func newInterceptor(t *testing.T, server string) *interceptor {
	t.Helper()
	ca, err := pgserver.NewCA("interceptor")
	require.NoError(t, err)
	cert, err := ca.Certificate("127.0.0.1")
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ic := &interceptor{ln: ln, cert: cert, server: server}
	ic.wg.Add(1)
	go ic.serve()
	t.Cleanup(func() {
		ln.Close()
		ic.wg.Wait()
	})
	return ic
}

func (ic *interceptor) addr() string { return ic.ln.Addr().String() }

func (ic *interceptor) serve() {
	defer ic.wg.Done()
	for {
		c, err := ic.ln.Accept()
		if err != nil {
			return
		}
		ic.wg.Add(1)
		go func() {
			defer ic.wg.Done()
			ic.relay(c)
		}()
	}
}

// sslRequest is the SSLRequest message.
var sslRequest = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}

func (ic *interceptor) relay(client net.Conn) {
	defer client.Close()
	req := make([]byte, 8)
	if _, err := io.ReadFull(client, req); err != nil || binary.BigEndian.Uint32(req[4:]) != 80877103 {
		return
	}
	if _, err := client.Write([]byte{'S'}); err != nil {
		return
	}
	ctls := tls.Server(client, &tls.Config{Certificates: []tls.Certificate{ic.cert}})
	if err := ctls.Handshake(); err != nil {
		return
	}
	server, err := net.Dial("tcp", ic.server)
	if err != nil {
		return
	}
	defer server.Close()
	if _, err := server.Write(sslRequest); err != nil {
		return
	}
	resp := make([]byte, 1)
	if _, err := io.ReadFull(server, resp); err != nil || resp[0] != 'S' {
		return
	}
	stls := tls.Client(server, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the interceptor trusts anything
	if err := stls.Handshake(); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(stls, ctls); done <- struct{}{} }()
	go func() { _, _ = io.Copy(ctls, stls); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	<-done
}

// interceptedDSN is the server's DSN through the interceptor, with sslmode=require (encrypted,
// not verified) and the given channel_binding.
func interceptedDSN(t *testing.T, s *pgserver.Server, ic *interceptor, binding string) (dsn, server string) {
	t.Helper()
	u, err := url.Parse(s.DSN())
	require.NoError(t, err)
	server = u.Host
	u.Host = ic.addr()
	q := u.Query()
	q.Del("sslrootcert")
	q.Set("sslmode", "require")
	if binding != "" {
		q.Set("channel_binding", binding)
	}
	u.RawQuery = q.Encode()
	return u.String(), server
}

// TestTLSInterceptorRefused: a TLS interceptor presenting its own certificate to a client with
// sslmode=require and the default channel_binding=prefer is refused by the server's SCRAM channel
// binding check, through pgxlanes as through pgxpool. With channel_binding=disable both get
// through, which shows the interceptor works. pgxlanes used to be accepted with prefer, and then
// sent every query through the interceptor.
func TestTLSInterceptorRefused(t *testing.T) {
	s := tlsServer(t)
	u, err := url.Parse(s.DSN())
	require.NoError(t, err)
	ic := newInterceptor(t, u.Host)

	for _, tc := range []struct {
		binding string
		refused bool
	}{{"", true}, {"prefer", true}, {"require", true}, {"disable", false}} {
		t.Run("channel_binding="+tc.binding, func(t *testing.T) {
			dsn, _ := interceptedDSN(t, s, ic, tc.binding)
			perr, lerr := bothPools(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.ConnectTimeout = 5 * time.Second })
			t.Logf("pgxpool: %v", perr)
			t.Logf("pgxlanes: %v", lerr)
			if !tc.refused {
				require.NoError(t, perr, "pgxpool through the interceptor")
				require.NoError(t, lerr, "pgxlanes through the interceptor")
				return
			}
			require.Error(t, perr, "pgxpool must be refused")
			require.Error(t, lerr, "pgxlanes must be refused as pgxpool is")
			if tc.binding != "require" {
				for _, err := range []error{perr, lerr} {
					assert.True(t, strings.Contains(err.Error(), "channel binding") && strings.Contains(err.Error(), "28000"),
						"refused by the server's binding check: %v", err)
				}
			}
		})
	}
}

// TestTLSLanesKeepTheirFeatures: over TLS with channel binding, where the wire.Conn sits beside
// pgconn's *tls.Conn, the lanes still stage their settings without a round trip and a deadline
// still returns at once with the connection kept; in every exec mode, batches included.
func TestTLSLanesKeepTheirFeatures(t *testing.T) {
	s := tlsServer(t)
	dsn := setParam(t, s.DSN(), "channel_binding", "require")
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			p := newLanes(t, dsn, "pool_max_conns=1&default_query_exec_mode="+mode)
			show := func(q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}) string {
				var v string
				require.NoError(t, q.QueryRow(ctx, "show statement_timeout").Scan(&v))
				return v
			}
			batchOn := func(q interface {
				SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
			}) string {
				b := &pgx.Batch{}
				var v string
				b.Queue("show statement_timeout").QueryRow(func(r pgx.Row) error { return r.Scan(&v) })
				require.NoError(t, q.SendBatch(ctx, b).Close())
				return v
			}
			batchShow := func() string { return batchOn(p) }
			assert.Equal(t, "5s", show(p), "Short")
			tx, err := p.Begin(ctx)
			require.NoError(t, err)
			assert.Equal(t, "30s", show(tx), "Tx")
			require.NoError(t, tx.Commit(ctx))
			assert.Equal(t, "5s", batchShow(), "a Short batch after a transaction")
			c, err := p.Acquire(ctx)
			require.NoError(t, err)
			assert.Equal(t, "30s", batchOn(c), "a held connection's first statement, a batch")
			assert.Equal(t, "30s", show(c), "held")
			pid := c.Conn().PgConn().PID()
			c.Release()
			assert.Equal(t, "5s", batchShow(), "a Short batch after a held connection")

			// A deadline returns at once; the connection is cleaned and kept.
			dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			start := time.Now()
			_, err = p.Exec(dctx, "select pg_sleep(3)")
			cancel()
			took := time.Since(start)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Less(t, took, time.Second, "the deadline returned at once")
			var pid2 uint32
			require.NoError(t, p.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid2))
			assert.Equal(t, pid, pid2, "the connection was kept")
			assert.Equal(t, "5s", show(p))
		})
	}
}

// TestTokenLoginEverySession: a role whose password is a token that changes with every session
// (as an AWS RDS IAM or Azure AD login is), supplied by pgxpool.Config.BeforeConnect. pgxpool and
// the lanes connect; the guard session logs in the same way, so budget terminates, lock-holder
// lookups and the Long lane's fleet slots work. The guard used to connect with the parsed
// password alone and fail with 28P01.
func TestTokenLoginEverySession(t *testing.T) {
	ctx := context.Background()
	s := pgserver.Shared(t)
	dbDSN := newDB(t, 10)
	tr, err := s.NewTokenRole(ctx, "tok_"+pgserver.RandomHex(4))
	require.NoError(t, err)
	admin, err := pgx.Connect(ctx, dbDSN)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "grant all on items to "+pgx.Identifier{tr.Name()}.Sanitize())
	require.NoError(t, err)

	u, err := url.Parse(dbDSN)
	require.NoError(t, err)
	u.User = url.User(tr.Name()) // no password: only a fresh token logs in
	dsn := u.String()
	tokens := func(ctx context.Context, cc *pgx.ConnConfig) error {
		tok, err := tr.Next(ctx)
		cc.Password = tok
		return err
	}

	// pgxpool, for comparison.
	pc, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	pc.BeforeConnect = tokens
	pp, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pp.Close()
	var one int
	require.NoError(t, pp.QueryRow(ctx, "select 1").Scan(&one), "pgxpool")

	logs := &logBuffer{}
	p := newTerminatingPool(t, dsn+"&lane_short_lock_timeout=100ms&lane_long_fleet_max_conns=1", func(c *pgxlanes.Config) {
		c.BeforeConnect = tokens
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	require.NoError(t, p.QueryRow(ctx, "select 1").Scan(&one), "pgxlanes Short")
	_, err = p.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select 1")
	require.NoError(t, err, "pgxlanes Long with a fleet slot: the guard session holds the fleet's locks")
	assertGuardTerminates(t, p)

	// A lock timeout names the holder, looked up over the guard session.
	tx, err := p.Begin(pgxlanes.WithBudget(pgxlanes.WithTag(ctx, "checkout"), time.Minute))
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "select v from items where id = 1 for update")
	require.NoError(t, err)
	_, err = p.Exec(ctx, "update items set v = 0 where id = 1")
	require.Equal(t, "55P03", sqlState(err))
	pgserver.Eventually(t, 5*time.Second, "a lock-holder log line naming the transaction", func() bool {
		for _, r := range logs.records(t) {
			if r["msg"] == "pgxlanes: lock timeout; likely holders" {
				return true
			}
		}
		return false
	})
	for _, r := range logs.records(t) {
		e, _ := r["error"].(string)
		assert.NotContains(t, e, "28P01", "no failed login: %v", r)
	}
	t.Logf("tokens issued: %d", tr.Issued())
}
