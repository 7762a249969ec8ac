package pgxlanes

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestDefaultLanes(t *testing.T) {
	tests := []struct {
		n                                                  int
		shortR, txR, txCap, longCap, shortCap, shortWaiter int
	}{
		{1, 0, 0, 1, 1, 1, 32},
		{2, 1, 0, 1, 1, 2, 64},
		{4, 1, 1, 3, 1, 4, 128},
		{8, 2, 3, 6, 1, 8, 256},
		{20, 5, 7, 15, 3, 20, 640},
	}
	for _, tc := range tests {
		c, err := ParseConfig("host=127.0.0.1 pool_max_conns=" + itoa(tc.n))
		if err != nil {
			t.Fatal(err)
		}
		got := []int{c.Short.Reserved, c.Tx.Reserved, c.Tx.MaxConns, c.Long.MaxConns, c.Short.MaxConns, c.Short.MaxWaiters}
		want := []int{tc.shortR, tc.txR, tc.txCap, tc.longCap, tc.shortCap, tc.shortWaiter}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("N=%d: [short reserved, tx reserved, tx cap, long cap, short cap, short waiters] = %v, want %v", tc.n, got, want)
				break
			}
		}
		if err := c.validate(); err != nil {
			t.Errorf("N=%d: defaults do not validate: %v", tc.n, err)
		}
		// Tx can never take Short's reserve: its cap leaves it free.
		if c.Tx.MaxConns+c.Short.Reserved > tc.n {
			t.Errorf("N=%d: tx cap %d + short reserve %d exceeds the pool", tc.n, c.Tx.MaxConns, c.Short.Reserved)
		}
	}
	c, _ := ParseConfig("host=127.0.0.1 pool_max_conns=8")
	if c.Short.AcquireTimeout != time.Second || c.Tx.AcquireTimeout != 10*time.Second || c.Short.StatementTimeout != 5*time.Second ||
		c.Long.StatementTimeout != 0 || c.Tx.Budget != 30*time.Second || c.Long.Budget != 10*time.Minute {
		t.Errorf("timeouts: short %+v tx %+v long %+v", c.Short, c.Tx, c.Long)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestParseConfigLaneParams(t *testing.T) {
	c, err := ParseConfig("postgres://u:secret@127.0.0.1:5432/db?pool_max_conns=10&lane_short_reserved=4&lane_short_acquire_timeout=250ms" +
		"&lane_tx_max_conns=5&lane_tx_statement_timeout=2000&lane_long_budget=1h&lane_long_max_waiters=3&application_name=x")
	if err != nil {
		t.Fatal(err)
	}
	if c.Short.Reserved != 4 || c.Short.AcquireTimeout != 250*time.Millisecond || c.Tx.MaxConns != 5 ||
		c.Tx.StatementTimeout != 2*time.Second || c.Long.Budget != time.Hour || c.Long.MaxWaiters != 3 {
		t.Fatalf("lanes: %+v %+v %+v", c.Short, c.Tx, c.Long)
	}
	// Tx's defaults follow Short's explicit reserve.
	if c.Tx.Reserved != 3 {
		t.Fatalf("tx reserved %d, want (10-4)/2 = 3", c.Tx.Reserved)
	}
	for k := range c.ConnConfig.RuntimeParams {
		if strings.HasPrefix(k, "lane_") {
			t.Fatalf("lane parameter %s would be sent to the server", k)
		}
	}
	if c.ConnConfig.RuntimeParams["application_name"] != "x" {
		t.Fatal("other runtime params must be kept")
	}
}

func TestParseConfigTransactionPooler(t *testing.T) {
	c, err := ParseConfig("host=127.0.0.1 pgxlanes_transaction_pooler=true")
	if err != nil || !c.TransactionPooler {
		t.Fatalf("%v %v", c, err)
	}
	if _, sent := c.ConnConfig.RuntimeParams["pgxlanes_transaction_pooler"]; sent {
		t.Fatal("pgxlanes_transaction_pooler would be sent to the server")
	}
	if _, err := ParseConfig("host=127.0.0.1 pgxlanes_transaction_pooler=maybe"); err == nil ||
		!strings.Contains(err.Error(), "pgxlanes_transaction_pooler") {
		t.Fatalf("bad bool: %v", err)
	}
	c, _ = ParseConfig("host=127.0.0.1 pgxlanes_transaction_pooler=true lane_long_over_budget=terminate")
	if _, err := NewWithConfig(t.Context(), c); err == nil || !strings.Contains(err.Error(), "lane_long_over_budget") {
		t.Fatalf("terminate behind a pooler: %v", err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	const base = "postgres://user:hunter2secret@127.0.0.1:5432/db?pool_max_conns=8&"
	tests := []struct{ params, want string }{
		{"lane_fast_reserved=1", `lane_fast_reserved: unknown lane "fast"`},
		{"lane_short_bogus=1", `lane_short_bogus: unknown lane setting "bogus"`},
		{"lane_short=1", "lane_short: want lane_<short|tx|long>_<setting>"},
		{"lane_short_reserved=-1", `lane_short_reserved: "-1" is not a whole number`},
		{"lane_short_reserved=abc", `lane_short_reserved: "abc" is not a whole number`},
		{"lane_tx_acquire_timeout=soon", `lane_tx_acquire_timeout: "soon" is not a duration`},
		{"lane_tx_acquire_timeout=-5s", `lane_tx_acquire_timeout: "-5s" is negative`},
		{"lane_long_budget=-10", `lane_long_budget: "-10" is negative`},
		{"lane_long_budget=18446744073710", `lane_long_budget: "18446744073710" milliseconds is too long`},
		{"lane_long_budget=9223372036855", `lane_long_budget: "9223372036855" milliseconds is too long`},
		{"lane_tx_over_budget=kill", `lane_tx_over_budget: "kill" is not flag, cancel or terminate`},
	}
	for _, tc := range tests {
		_, err := ParseConfig(base + tc.params)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.params, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2secret") {
			t.Errorf("%s: error leaks the password: %v", tc.params, err)
		}
	}
	// pgconn's own parse errors are redacted too.
	_, err := ParseConfig("postgres://user:hunter2secret@127.0.0.1:notaport/db")
	if err == nil || strings.Contains(err.Error(), "hunter2secret") {
		t.Fatalf("bad port: %v", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"reserves above total", func(c *Config) { c.Short.Reserved = 5; c.Tx.Reserved = 4 },
			"the lanes reserve 9 connections in all (short 5, tx 4, long 0), more than MaxConns (pool_max_conns) 8"},
		{"cap above total", func(c *Config) { c.Long.MaxConns = 9 }, "long lane: MaxConns (lane_long_max_conns) 9 exceeds the pool's MaxConns (pool_max_conns) 8"},
		{"reserve above cap", func(c *Config) { c.Tx.Reserved = 7 }, "tx lane: Reserved (lane_tx_reserved) 7 exceeds the lane's MaxConns 6"},
		{"negative timeout", func(c *Config) { c.Short.AcquireTimeout = -1 }, "short lane: AcquireTimeout (lane_short_acquire_timeout) must not be negative"},
		{"negative waiters", func(c *Config) { c.Tx.MaxWaiters = -1 }, "tx lane: MaxWaiters (lane_tx_max_waiters) must not be negative"},
		{"zero cap", func(c *Config) { c.Long.MaxConns = 0 }, "long lane: MaxConns (lane_long_max_conns) must be at least 1"},
		{"long starved", func(c *Config) { c.Short.Reserved = 2; c.Tx.Reserved = 6 }, "long lane: Reserved (lane_long_reserved) is 0 and the other lanes reserve all 8"},
		{"nil pgxpool config", func(c *Config) { c.Config = nil }, "Config must be created by ParseConfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig("host=127.0.0.1 pool_max_conns=8")
			if err != nil {
				t.Fatal(err)
			}
			tc.mod(c)
			_, err = NewWithConfig(t.Context(), c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestResizeUntouchedLanes(t *testing.T) {
	c, err := ParseConfig("host=127.0.0.1 pool_max_conns=4 lane_long_budget=1m")
	if err != nil {
		t.Fatal(err)
	}
	c.MaxConns = 20
	p, err := NewWithConfig(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := p.Config()
	if got.Short.Reserved != 5 || got.Short.MaxConns != 20 || got.Tx.MaxConns != 15 || got.Long.Budget != time.Minute {
		t.Fatalf("lanes not resized for MaxConns 20: %+v %+v %+v", got.Short, got.Tx, got.Long)
	}
}

func TestBeginSQL(t *testing.T) {
	c, _ := ParseConfig("host=127.0.0.1 pool_max_conns=4 lane_tx_statement_timeout=1500ms lane_tx_lock_timeout=250us")
	p, err := NewWithConfig(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	o := p.txOptions(Tx, 30*time.Second, pgx.TxOptions{IsoLevel: "serializable", AccessMode: "read only"})
	want := "begin isolation level serializable read only; set local statement_timeout = 1500; set local lock_timeout = 1; set local idle_in_transaction_session_timeout = 63000"
	if o.BeginQuery != want {
		t.Fatalf("BeginQuery %q, want %q", o.BeginQuery, want)
	}
	if got := p.txOptions(Tx, 30*time.Second, pgx.TxOptions{}).BeginQuery; got != "begin; set local statement_timeout = 1500; set local lock_timeout = 1; set local idle_in_transaction_session_timeout = 63000" {
		t.Fatalf("default BeginQuery %q", got)
	}
	// Short's timeouts are the session defaults: only the budget's backstop (cancel at 6s,
	// terminate at 12s, plus 1s) is set.
	if got := p.txOptions(Short, 6*time.Second, pgx.TxOptions{}).BeginQuery; got != "begin; set local idle_in_transaction_session_timeout = 13000" {
		t.Fatalf("short BeginQuery %q", got)
	}
	// A per-call budget (WithBudget) changes the backstops; the lane's flag action has none.
	if got := p.txOptions(Tx, 2*time.Second, pgx.TxOptions{}).BeginQuery; got != "begin; set local statement_timeout = 1500; set local lock_timeout = 1; set local idle_in_transaction_session_timeout = 5000" {
		t.Fatalf("tx BeginQuery with a 2s budget %q", got)
	}
	if got := p.txOptions(Long, time.Hour, pgx.TxOptions{}).BeginQuery; got != "begin; set local statement_timeout = 0; set local lock_timeout = 30000" {
		t.Fatalf("long BeginQuery %q", got)
	}
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
	c, _ := ParseConfig("host=127.0.0.1 pool_max_conns=2")
	p, err := NewWithConfig(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a := &countingObserver{}
	n := 0
	removeA := p.AddObserver(a)
	removeB := p.AddObserver(valueObserver{&n})
	p.AddObserver(valueObserver{&n})
	p.observeAcquire(AcquireEvent{Lane: Tx})
	removeA()
	removeA()
	removeB()
	p.observeAcquire(AcquireEvent{Lane: Short})
	if len(a.acquires) != 1 || a.acquires[0].Lane != Tx || n != 3 {
		t.Fatalf("a saw %v, value observers %d times; want 1 and 3", a.acquires, n)
	}
}
