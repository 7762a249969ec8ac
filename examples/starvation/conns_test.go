package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// TestWaitConnsWaitsForEstablishedConnections checks that waitConns returns only once every
// connection of a contender is established, as the server sees it: a warm-up that found one still
// connecting waited for it, and pgxlanes' Short lane gave up after its 1 s acquire timeout.
func TestWaitConnsWaitsForEstablishedConnections(t *testing.T) {
	t.Parallel()
	dsn := pgserver.NewDatabase(t)
	cfg, _, err := parseFlags([]string{"-dsn", dsn, "-conns", "4", "-fast-conns", "1", "-plot", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := contenders(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	backends := func() int {
		var n int
		if err := admin.QueryRow(ctx, "select count(*) from pg_stat_activity where datname = current_database()"+
			" and backend_type = 'client backend' and pid <> pg_backend_pid()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, spec := range specs {
		ps, err := spec.build(ctx, dsn, cfg, newRecorder())
		if err != nil {
			t.Fatalf("%s: %v", spec.name, err)
		}
		err = waitConns(ctx, ps, int32(cfg.conns))
		n := backends()
		ps.close()
		if err != nil {
			t.Fatalf("%s: %v", spec.name, err)
		}
		if n < cfg.conns {
			t.Errorf("%s: waitConns returned with %d server sessions, want %d", spec.name, n, cfg.conns)
		}
		pgserver.Eventually(t, 10*time.Second, spec.name+"'s sessions to end", func() bool { return backends() == 0 })
	}
}
