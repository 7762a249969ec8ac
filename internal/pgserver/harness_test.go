package pgserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestServerAnswers(t *testing.T) {
	s := pgserver.Shared(t)
	t.Logf("source %s, version %q", s.Source(), s.Version())
	conn := connect(t, pgserver.DSN(t))
	var version string
	if err := conn.QueryRow(context.Background(), "select version()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(version, "PostgreSQL ") {
		t.Fatalf("version() = %q", version)
	}
	t.Log(version)
}

func TestCreateDatabaseIsolated(t *testing.T) {
	ctx := context.Background()
	dsn1, dsn2 := pgserver.NewDatabase(t), pgserver.NewDatabase(t)
	if dsn1 == dsn2 {
		t.Fatal("two databases have the same DSN")
	}
	c1, c2 := connect(t, dsn1), connect(t, dsn2)

	var db1, db2 string
	if err := c1.QueryRow(ctx, "select current_database()").Scan(&db1); err != nil {
		t.Fatal(err)
	}
	if err := c2.QueryRow(ctx, "select current_database()").Scan(&db2); err != nil {
		t.Fatal(err)
	}
	if db1 == db2 || db1 == "postgres" || db2 == "postgres" {
		t.Fatalf("current_database: %q and %q", db1, db2)
	}

	if _, err := c1.Exec(ctx, "create table only_in_one (id int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c2.QueryRow(ctx, "select count(*) from pg_class where relname = 'only_in_one'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a table created in one database is visible in the other")
	}

	// Session counts are per database: db2 saw only our connection.
	var sessions int64
	err := c2.QueryRow(ctx, "select sessions from pg_stat_database where datname = current_database()").Scan(&sessions)
	if err != nil {
		t.Fatal(err)
	}
	if sessions > 1 {
		t.Errorf("pg_stat_database.sessions = %d for a new database with one connection", sessions)
	}
}

func TestDropDatabase(t *testing.T) {
	ctx := context.Background()
	s := pgserver.Shared(t)
	dsn, err := s.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, dsn) // a session left open: DROP ... WITH (FORCE) closes it
	if err := s.DropDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("a session of the dropped database still answers")
	}
	if c, err := pgx.Connect(ctx, dsn); err == nil {
		c.Close(ctx)
		t.Error("connected to a dropped database")
	}
	if err := s.DropDatabase(ctx, s.DSN()); err == nil {
		t.Error("DropDatabase dropped the server's own database")
	}
}

func TestDSNHasPassword(t *testing.T) {
	s := pgserver.Shared(t)
	if s.Source() == pgserver.SourceEnv {
		t.Skipf("%s is set: authentication is that server's, not the harness's", pgserver.EnvDatabase)
	}
	cfg, err := pgconn.ParseConfig(s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	password := cfg.Password
	if len(password) < 16 {
		t.Fatalf("password %d characters long, want a random one", len(password))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg.Password = ""
	if conn, err := pgconn.ConnectConfig(ctx, cfg); err == nil {
		conn.Close(ctx)
		t.Fatal("connected without a password")
	}
	cfg.Password = "wrong-" + password
	_, err = pgconn.ConnectConfig(ctx, cfg)
	if err == nil {
		t.Fatal("connected with a wrong password")
	}
	if strings.Contains(err.Error(), password) {
		t.Fatal("the connection error contains the password")
	}
}

func TestPgBouncerTransactionMode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	upstream := pgserver.NewDatabase(t)
	dsn, stop, err := pgserver.StartPgBouncer(ctx, upstream, "transaction")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	if dsn == upstream {
		t.Fatal("pgbouncer DSN is the upstream DSN")
	}

	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec // no prepared statements in transaction mode
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	want, _ := pgx.ParseConfig(upstream)
	var db string
	var sum int
	if err := conn.QueryRow(ctx, "select current_database(), $1::int + 1", 41).Scan(&db, &sum); err != nil {
		t.Fatal(err)
	}
	if db != want.Database || sum != 42 {
		t.Fatalf("got %q, %d; want %q, 42", db, sum, want.Database)
	}

	// The admin console confirms the pool mode.
	admin := cfg.Copy()
	admin.Database = "pgbouncer"
	admin.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	ac, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close(ctx)
	rows, err := ac.Query(ctx, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	mode := ""
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		if len(vals) >= 2 && vals[0] == "pool_mode" {
			mode, _ = vals[1].(string)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if mode != "transaction" {
		t.Fatalf("pgbouncer pool_mode = %q", mode)
	}

	// A wrong password is refused by pgbouncer itself.
	bad := cfg.Copy()
	bad.Password = "wrong"
	if c, err := pgx.ConnectConfig(ctx, bad); err == nil {
		c.Close(ctx)
		t.Error("pgbouncer accepted a wrong password")
	}

	stop()
	stop() // safe twice
	if c, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		c.Close(ctx)
		t.Error("pgbouncer still answers after stop")
	}
}

func TestStartPgBouncerBadMode(t *testing.T) {
	_, _, err := pgserver.StartPgBouncer(context.Background(), "postgres://u:p@127.0.0.1/db", "bogus")
	if err == nil || !strings.HasPrefix(err.Error(), "harness: ") {
		t.Fatalf("err = %v", err)
	}
}

// A running server and a stopped pgbouncer leave no goroutines behind, so tests that use goleak
// can use the harness.
func TestNoGoroutines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgserver.NewDatabase(t)
	_, stop, err := pgserver.StartPgBouncer(ctx, dsn, "session")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	goleak.VerifyNone(t)
}
