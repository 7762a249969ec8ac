package pgxlanes

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func resolved(t *testing.T, dsn string) *Config {
	t.Helper()
	c, err := ParseConfig(dsn)
	require.NoError(t, err)
	r, err := c.resolve()
	require.NoError(t, err)
	return r
}

func TestDefaultLanes(t *testing.T) {
	for _, tc := range []struct {
		n                                                  int
		shortR, txR, txCap, longCap, shortCap, shortWaiter int
	}{
		// A pool of one connection cannot be split: Short reserves none (README, migration.md).
		{1, 0, 0, 1, 1, 1, 32},
		{2, 1, 0, 1, 1, 2, 64},
		{4, 1, 1, 3, 1, 4, 128},
		{8, 2, 3, 6, 1, 8, 256},
		{20, 5, 7, 15, 3, 20, 640},
	} {
		t.Run(strconv.Itoa(tc.n), func(t *testing.T) {
			c := resolved(t, "host=127.0.0.1 pool_max_conns="+strconv.Itoa(tc.n))
			got := []int{c.Short.Reserved, c.Tx.Reserved, c.Tx.MaxConns, c.Long.MaxConns, c.Short.MaxConns, c.Short.MaxWaiters}
			want := []int{tc.shortR, tc.txR, tc.txCap, tc.longCap, tc.shortCap, tc.shortWaiter}
			assert.Equal(t, want, got, "[short reserved, tx reserved, tx cap, long cap, short cap, short waiters]")
			assert.LessOrEqual(t, c.Tx.MaxConns+c.Short.Reserved, tc.n, "tx cap + short reserve within the pool")
		})
	}
	c := resolved(t, "host=127.0.0.1 pool_max_conns=8")
	assert.Equal(t, time.Second, c.Short.AcquireTimeout)
	assert.Equal(t, 10*time.Second, c.Tx.AcquireTimeout)
	assert.Equal(t, 5*time.Second, c.Short.StatementTimeout)
	assert.Equal(t, 6*time.Second, c.Short.Budget)
	assert.Equal(t, time.Duration(Off), c.Long.StatementTimeout)
	assert.Equal(t, 30*time.Second, c.Tx.Budget)
	assert.Equal(t, 10*time.Minute, c.Long.Budget)
	assert.Equal(t, time.Second, c.Short.SlowThreshold)
}

// Without pool_max_conns the pool is pgxpool's default plus Short's reserve, so that Tx keeps
// pgxpool's capacity.
func TestDefaultPoolSize(t *testing.T) {
	for p, want := range map[int32]int32{4: 5, 8: 10, 16: 21, 64: 85} {
		n := defaultPoolSize(p)
		assert.Equal(t, want, n, "pgxpool default %d", p)
		assert.GreaterOrEqual(t, int(n)-shortReserve(int(n)), int(p))
	}
	c, err := ParseConfig("host=127.0.0.1")
	require.NoError(t, err)
	pc, err := pgxpool.ParseConfig("host=127.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, defaultPoolSize(pc.MaxConns), c.MaxConns)
	r, err := c.resolve()
	require.NoError(t, err)
	assert.Equal(t, int(pc.MaxConns), r.Tx.MaxConns, "Tx reaches pgxpool's default size")
	c, err = ParseConfig("host=127.0.0.1 pool_max_conns=4")
	require.NoError(t, err)
	assert.EqualValues(t, 4, c.MaxConns, "an explicit size is kept")
}

func TestParseConfigLaneParams(t *testing.T) {
	c, err := ParseConfig("postgres://u:secret@127.0.0.1:5432/db?pool_max_conns=10&lane_short_reserved=4&lane_short_acquire_timeout=250ms" +
		"&lane_tx_max_conns=5&lane_tx_statement_timeout=2s&lane_long_budget=1h&lane_long_max_waiters=3&lane_long_statement_timeout=0")
	require.NoError(t, err)
	// ParseConfig keeps what the DSN says and leaves the rest zero, for NewWithConfig.
	assert.Equal(t, 4, c.Short.Reserved)
	assert.Equal(t, 0, c.Tx.Reserved)
	assert.Equal(t, time.Duration(Off), c.Long.StatementTimeout, "0 means off")
	_, sent := c.ConnConfig.RuntimeParams["lane_short_reserved"]
	assert.False(t, sent, "lane parameters are not sent to the server")

	r, err := c.resolve()
	require.NoError(t, err)
	assert.Equal(t, 250*time.Millisecond, r.Short.AcquireTimeout)
	assert.Equal(t, 5, r.Tx.MaxConns)
	assert.Equal(t, 2*time.Second, r.Tx.StatementTimeout)
	assert.Equal(t, time.Hour, r.Long.Budget)
	assert.Equal(t, 3, r.Long.MaxWaiters)
	assert.Equal(t, 3, r.Tx.Reserved, "(10-4)/2")
}

// Short's default budget follows its statement timeout: with a 10s statement timeout, a 7s
// statement is not cancelled at a fixed 6s.
func TestShortBudgetFollowsStatementTimeout(t *testing.T) {
	c := resolved(t, "host=127.0.0.1 lane_short_statement_timeout=10s")
	assert.Equal(t, 11*time.Second, c.Short.Budget)
	c, err := ParseConfig("host=127.0.0.1")
	require.NoError(t, err)
	c.Short.StatementTimeout = 3 * time.Second // changed in code after ParseConfig
	r, err := c.resolve()
	require.NoError(t, err)
	assert.Equal(t, 4*time.Second, r.Short.Budget)
}

// Defaults are resolved in NewWithConfig, so a MaxConns changed after ParseConfig sizes every
// lane it did not set.
func TestDefaultsFollowMaxConns(t *testing.T) {
	c, err := ParseConfig("host=127.0.0.1 pool_max_conns=4 lane_long_budget=1m")
	require.NoError(t, err)
	c.MaxConns = 20
	p, err := NewWithConfig(t.Context(), c)
	require.NoError(t, err)
	defer p.Close()
	got := p.Config()
	assert.Equal(t, 5, got.Short.Reserved)
	assert.Equal(t, 20, got.Short.MaxConns)
	assert.Equal(t, 15, got.Tx.MaxConns)
	assert.Equal(t, time.Minute, got.Long.Budget)
}

func TestParseConfigTransactionPooler(t *testing.T) {
	c, err := ParseConfig("host=127.0.0.1 pgxlanes_transaction_pooler=true pgxlanes_cancel_requests=false")
	require.NoError(t, err)
	assert.True(t, c.TransactionPooler)
	assert.True(t, c.NoCancelRequests)
	_, err = ParseConfig("host=127.0.0.1 pgxlanes_transaction_pooler=maybe")
	require.ErrorContains(t, err, "pgxlanes_transaction_pooler")
	c.Long.OverBudget = ActionTerminate
	_, err = NewWithConfig(t.Context(), c)
	require.ErrorContains(t, err, "lane_long_over_budget")
}

func TestParseConfigErrors(t *testing.T) {
	const base = "postgres://user:hunter2secret@127.0.0.1:5432/db?"
	for _, tc := range []struct{ params, want string }{
		{"lane_short=1", "lane_short: want lane_<short|tx|long>_<setting>"},
		{"lane_bulk_reserved=1", "lane_bulk_reserved: unknown lane \"bulk\""},
		{"lane_tx_speed=1", "lane_tx_speed: unknown lane setting \"speed\""},
		{"lane_tx_reserved=-1", "lane_tx_reserved: \"-1\" is not a whole number"},
		{"lane_tx_reserved=x", "lane_tx_reserved: \"x\" is not a whole number"},
		{"lane_tx_acquire_timeout=soon", "lane_tx_acquire_timeout: \"soon\" is not a duration"},
		// A bare number is refused: it would silently be milliseconds.
		{"lane_tx_budget=10", "lane_tx_budget: \"10\" has no unit (write 10ms or 10s"},
		{"lane_tx_budget=-1s", "lane_tx_budget: \"-1s\" is negative"},
		{"lane_tx_over_budget=kill", "lane_tx_over_budget: \"kill\" is not flag, cancel or terminate"},
		{"pool_max_conns=bad", "cannot parse pool_max_conns (\"bad\" is not a valid number)"},
		{"pool_max_conn_lifetime=forever", "cannot parse pool_max_conn_lifetime"},
	} {
		_, err := ParseConfig(base + tc.params)
		require.Error(t, err, tc.params)
		assert.Contains(t, err.Error(), tc.want, tc.params)
		assert.NotContains(t, err.Error(), "hunter2secret", tc.params)
	}
}

// ParseConfig never echoes the connection string: pgconn's redaction misses some valid spellings
// of the password.
func TestParseConfigErrorsNeverHoldThePassword(t *testing.T) {
	for _, dsn := range []string{
		"password = 'S3cretPW' pool_max_conns=bad",
		"password =S3cretPW pool_max_conns=bad",
		"password= S3cretPW pool_max_conns=bad",
		`password=x\ S3cretPW pool_max_conns=bad`,
		"host=127.0.0.1 password=S3cretPW port=notaport",
		"postgres://user:S3cretPW@127.0.0.1:notaport/db",
		"postgres://user:S3cretPW@127.0.0.1:5432/db?pool_max_conns=0",
		"postgres://user:S3cretPW@[::1/db",
		"host=127.0.0.1 password='S3cretPW sslmode=bogus",
	} {
		_, err := ParseConfig(dsn)
		require.Error(t, err, dsn)
		assert.NotContains(t, err.Error(), "S3cretPW", dsn)
		assert.True(t, strings.HasPrefix(err.Error(), "pgxlanes: "), err.Error())
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"reserves above total", func(c *Config) { c.Short.Reserved = 5; c.Tx.Reserved = 4 }, "reserve 9"},
		{"cap above total", func(c *Config) { c.Short.MaxConns = 9 }, "short lane: MaxConns (lane_short_max_conns) 9 exceeds"},
		// Tx can reach only its reserve plus the shared connections: 6 of a pool of 8.
		{"tx cap above reachable", func(c *Config) { c.Tx.MaxConns = 8 }, "tx lane: MaxConns (lane_tx_max_conns) 8 exceeds the 6"},
		{"reserve above cap", func(c *Config) { c.Tx.Reserved = 4; c.Tx.MaxConns = 3 }, "tx lane: Reserved (lane_tx_reserved) 4 exceeds"},
		{"negative timeout", func(c *Config) { c.Short.AcquireTimeout = -2 }, "short lane: AcquireTimeout (lane_short_acquire_timeout) must be positive"},
		{"negative waiters", func(c *Config) { c.Tx.MaxWaiters = -7 }, "tx lane: MaxWaiters (lane_tx_max_waiters) must be positive"},
		{"cap off", func(c *Config) { c.Long.MaxConns = Off }, "long lane: MaxConns (lane_long_max_conns) cannot be Off"},
		{"long starved", func(c *Config) { c.Short.Reserved = 2; c.Tx.Reserved = 6 }, "long"},
		{"short unbounded", func(c *Config) { c.Short.StatementTimeout = Off; c.Short.Budget = Off }, "short lane: StatementTimeout"},
		{"slow threshold on tx", func(c *Config) { c.Tx.SlowThreshold = time.Second }, "tx lane: SlowThreshold (lane_tx_slow_threshold) is Short's alone"},
		{"bad action", func(c *Config) { c.Tx.OverBudget = 9 }, "tx lane: OverBudget (lane_tx_over_budget)"},
		{"zero pool", func(c *Config) { c.MaxConns = 0 }, "MaxConns (pool_max_conns) must be at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig("host=127.0.0.1 pool_max_conns=8")
			require.NoError(t, err)
			tc.change(c)
			_, err = NewWithConfig(t.Context(), c)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A lane cap of 0 in a connection string is Off there, which a cap cannot be: the error says so
// in the DSN's terms, and how to get the default (leave the parameter out).
func TestLaneCapZeroInDSN(t *testing.T) {
	_, err := New(t.Context(), "host=127.0.0.1 pool_max_conns=8 lane_short_max_conns=0")
	require.Error(t, err)
	assert.ErrorContains(t, err, "short lane: MaxConns (lane_short_max_conns) cannot be Off (0 in a connection string)")
	assert.ErrorContains(t, err, "leave it out")
	assert.NotContains(t, err.Error(), "zero gives the default", "zero in the DSN is what was refused")
}

// A Config not made by ParseConfig gets an error, never a panic (pgxpool panics).
func TestConfigNotFromParseConfig(t *testing.T) {
	for _, c := range []*Config{nil, {}, {Config: &pgxpool.Config{}}} {
		assert.NotPanics(t, func() {
			_, err := NewWithConfig(t.Context(), c)
			assert.ErrorContains(t, err, "pgxlanes: Config must")
		})
	}
	// A pgxpool.Config built by hand around a parsed ConnConfig, as the pool's or as Long's
	// Server: pgxpool.NewWithConfig panics on it.
	cc, err := pgx.ParseConfig("host=127.0.0.1")
	require.NoError(t, err)
	assert.NotPanics(t, func() {
		_, err := NewWithConfig(t.Context(), &Config{Config: &pgxpool.Config{ConnConfig: cc, MaxConns: 4}})
		assert.ErrorContains(t, err, "pgxlanes: Config must be created by ParseConfig")
	})
	c, err := ParseConfig("host=127.0.0.1 pool_max_conns=4")
	require.NoError(t, err)
	c.Long.Server = &pgxpool.Config{ConnConfig: cc.Copy(), MaxConns: 2}
	c.Short.SlowThreshold = Off
	assert.NotPanics(t, func() {
		_, err := NewWithConfig(t.Context(), c)
		assert.ErrorContains(t, err, "long lane: Server must be made by pgxpool.ParseConfig")
	})
}

func TestSessionSQL(t *testing.T) {
	c := resolved(t, "host=127.0.0.1 pool_max_conns=4 lane_tx_statement_timeout=1500ms lane_tx_lock_timeout=250us")
	s := sessionSQL{defaults: c.Short}
	// A held connection or statement of Tx: its timeouts, as session settings.
	assert.Equal(t, "set statement_timeout = 1500; set lock_timeout = 1; reset idle_in_transaction_session_timeout", s.session(c.Tx, false, 0))
	// A transaction also gets the budget's backstop: cancel at 30s, terminate at 60s, plus 3s.
	assert.Equal(t, "set statement_timeout = 1500; set lock_timeout = 1; set idle_in_transaction_session_timeout = 63000",
		s.session(c.Tx, true, c.Tx.Budget))
	// Short's timeouts are the session defaults: nothing for a statement; a transaction of
	// Short gets only its budget's backstop (cancel at 6s, terminate at 12s, plus 1s).
	assert.Equal(t, "", s.session(c.Short, false, 0))
	assert.Equal(t, "set idle_in_transaction_session_timeout = 13000; reset statement_timeout; reset lock_timeout", s.session(c.Short, true, c.Short.Budget))
	// A per-call budget changes the backstops; the Long lane's flag action has none.
	assert.Equal(t, "set statement_timeout = 1500; set lock_timeout = 1; set idle_in_transaction_session_timeout = 5000",
		s.session(c.Tx, true, 2*time.Second))
	assert.Equal(t, "set statement_timeout = 0; set lock_timeout = 30000; reset idle_in_transaction_session_timeout", s.session(c.Long, true, time.Hour))
	// Against PostgreSQL's defaults (nobody set a timeout), Short sets its own.
	d := sessionSQL{defaults: LaneConfig{StatementTimeout: Off, LockTimeout: Off}}
	assert.Equal(t, "set statement_timeout = 5000; set lock_timeout = 1000; reset idle_in_transaction_session_timeout", d.session(c.Short, false, 0))
	// Behind a transaction pooler nothing goes on the session; transactions use SET LOCAL.
	ps := sessionSQL{defaults: LaneConfig{StatementTimeout: Off, LockTimeout: Off}, pooler: true}
	assert.Equal(t, "", ps.session(c.Tx, false, 0))
	assert.Equal(t, "set local statement_timeout = 1500; set local lock_timeout = 1; set local idle_in_transaction_session_timeout = 63000",
		ps.local(c.Tx, c.Tx.Budget))
	assert.Equal(t, []string{"set local statement_timeout = 1500", "set local lock_timeout = 1",
		"set local idle_in_transaction_session_timeout = 63000"}, ps.batchLocals(c.Tx, c.Tx.Budget))
}

type countingObserver struct {
	acquires []AcquireEvent // a slice field: the type is not comparable
}

func (c *countingObserver) ObserveAcquire(e AcquireEvent) { c.acquires = append(c.acquires, e) }
func (c *countingObserver) ObserveRelease(ReleaseEvent)   {}

type valueObserver struct{ seen *int }

func (v valueObserver) ObserveAcquire(AcquireEvent) { *v.seen++ }
func (v valueObserver) ObserveRelease(ReleaseEvent) {}

func TestAddRemoveObserver(t *testing.T) {
	var o observers
	a := &countingObserver{}
	n := 0
	removeA := o.add(a)
	removeB := o.add(valueObserver{&n})
	o.add(valueObserver{&n})
	o.acquire(AcquireEvent{Lane: Tx})
	removeA()
	removeA()
	removeB()
	o.acquire(AcquireEvent{Lane: Short})
	require.Len(t, a.acquires, 1)
	assert.Equal(t, Tx, a.acquires[0].Lane)
	assert.Equal(t, 3, n)
}

// TestRolloutDSN: the "pgxpool's behaviour" parameters of docs/migration.md are valid.
func TestRolloutDSN(t *testing.T) {
	c := resolved(t, "postgres://app@127.0.0.1/app?pool_max_conns=8&lane_short_statement_timeout=0&lane_short_budget=1h"+
		"&lane_short_lock_timeout=0&lane_short_acquire_timeout=0&lane_short_max_waiters=0"+
		"&lane_tx_budget=0&lane_tx_acquire_timeout=0&lane_tx_max_waiters=0&lane_tx_lock_timeout=0&lane_short_reserved=0")
	assert.Equal(t, 0, c.Short.Reserved)
	assert.Equal(t, 8, c.Tx.MaxConns, "with no Short reserve, Tx reaches the whole pool as with pgxpool")
	assert.Equal(t, time.Duration(Off), c.Tx.Budget)
	assert.Equal(t, Off, c.Tx.MaxWaiters)
}

// TestErrorsNameTheParameter: a bad DSN value keeps pgx's reason, which names the parameter,
// without the password; a reserve too large names the lane parameter the user wrote.
func TestErrorsNameTheParameter(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"host=127.0.0.1 user=app password='S3cretPW' sslmode=bogus", "pgxlanes: connection string: failed to configure TLS (sslmode is invalid)"},
		{"postgres://app:S3cretPW@127.0.0.1/db?sslmode=bogus", "pgxlanes: connection string: failed to configure TLS (sslmode is invalid)"},
		{"host=127.0.0.1 password=S3cretPW target_session_attrs=bogus", "target_session_attrs"},
		{"host=127.0.0.1 password=S3cretPW channel_binding=x", "channel_binding"},
		{"postgres://app:S3cretPW@127.0.0.1/db?channel_binding=S3cretPW", "unknown channel_binding value: xxxxx"},
	} {
		_, err := ParseConfig(tc.dsn)
		require.Error(t, err, tc.dsn)
		assert.Contains(t, err.Error(), tc.want, tc.dsn)
		assert.NotContains(t, err.Error(), "S3cretPW", tc.dsn)
	}
	c, err := ParseConfig("host=127.0.0.1 pool_max_conns=4 lane_short_reserved=20")
	require.NoError(t, err)
	_, err = c.resolve()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "short 20 from Reserved (lane_short_reserved)")
	assert.Contains(t, err.Error(), "more than MaxConns (pool_max_conns) 4: lower lane_short_reserved, or raise MaxConns (pool_max_conns)")
}

// Copy is deep: a copy's Long.Server (pgxpool.Config and ConnConfig) can be changed without
// changing the original, as pgxpool.Config.Copy allows for its own ConnConfig.
func TestCopyIsDeep(t *testing.T) {
	c, err := ParseConfig("host=127.0.0.1 pool_max_conns=8")
	require.NoError(t, err)
	c.Long.Server, err = pgxpool.ParseConfig("host=replica1 pool_max_conns=3")
	require.NoError(t, err)
	n := c.Copy()
	n.Long.Server.MaxConns = 5
	n.Long.Server.ConnConfig.Host = "replica2"
	assert.EqualValues(t, 3, c.Long.Server.MaxConns)
	assert.Equal(t, "replica1", c.Long.Server.ConnConfig.Host)
	// A Server not made by ParseConfig is refused by name, not a panic in Copy.
	c.Long.Server = &pgxpool.Config{MaxConns: 1}
	assert.NotPanics(t, func() {
		_, err = NewWithConfig(t.Context(), c)
		assert.ErrorContains(t, err, "Server must be made by pgxpool.ParseConfig")
	})
}

// The default size applies unless pool_max_conns is a parameter: the words elsewhere in the
// connection string (a name, a password) do not count, and a service file's pool_max_conns does,
// as pgxpool.ParseConfig reads them.
func TestDefaultPoolSizeOnlyWithoutTheParameter(t *testing.T) {
	pc, err := pgxpool.ParseConfig("host=127.0.0.1")
	require.NoError(t, err)
	for _, dsn := range []string{
		"host=127.0.0.1 application_name=pool_max_conns_report",
		"postgres://app:pool_max_conns@127.0.0.1/db",
		"postgres://app@127.0.0.1/pool_max_conns",
	} {
		c, err := ParseConfig(dsn)
		require.NoError(t, err, dsn)
		assert.Equal(t, defaultPoolSize(pc.MaxConns), c.MaxConns, dsn)
	}
	file := filepath.Join(t.TempDir(), "pg_service.conf")
	require.NoError(t, os.WriteFile(file, []byte("[orders]\nhost=127.0.0.1\npool_max_conns=3\n"), 0o600))
	t.Setenv("PGSERVICEFILE", file)
	c, err := ParseConfig("service=orders")
	require.NoError(t, err)
	assert.EqualValues(t, 3, c.MaxConns, "the service file's pool_max_conns is kept")
}
