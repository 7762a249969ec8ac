// Command httpservice is a small HTTP service on pgxlanes that exports the pool's metrics.
//
//	GET  /items/{id}  a lookup: a plain query, Short lane, tag "item"
//	POST /orders      an order: a transaction, Tx lane, tag "order" (form value item=<id>)
//	GET  /report      a report: long work, annotated for the Long lane, tag "report"
//	GET  /metrics     Prometheus metrics (pgxlanes_..., go_..., process_...)
//	GET  /debug/pgxlanes  the pool's live status page (metrics/statuspage; ?format=json for scripts)
//
// A middleware puts each route's tag on the request context (pgxlanes.WithTag), and the collector
// exports those tags through an allow-list. A failed acquire (lane timeout or full queue) answers
// 503 with Retry-After, so clients back off instead of piling up.
//
// Usage:
//
//	cd examples && go run ./httpservice [-addr 127.0.0.1:8080] [-dsn postgres://...] [-report-delay 250ms]
//
// (examples is a module of its own: run it from examples/, or `make httpservice` from the root.)
//
// Without -dsn or DATABASE_URL it starts a throwaway PostgreSQL server with the test harness
// (internal/pgserver) and removes it on exit. It listens on 127.0.0.1 only. SIGINT or SIGTERM
// shuts it down gracefully: in-flight requests finish, then the pool and the server close.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/metrics"
	"github.com/pgxlanes/pgxlanes/metrics/statuspage"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// shutdownTimeout bounds the wait for in-flight requests on shutdown.
const shutdownTimeout = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], nil); err != nil {
		fmt.Fprintln(os.Stderr, "httpservice:", err)
		os.Exit(1)
	}
}

// run parses args, starts the service and serves until ctx ends, then shuts down gracefully. It
// calls ready, if not nil, with the address it listens on once it accepts requests.
func run(ctx context.Context, args []string, ready func(addr string)) error {
	fs := flag.NewFlagSet("httpservice", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address, on 127.0.0.1 (port 0 picks a free one)")
	dsn := fs.String("dsn", os.Getenv("DATABASE_URL"),
		"PostgreSQL DSN, lane parameters allowed (default $DATABASE_URL; if empty, a throwaway server)")
	reportDelay := fs.Duration("report-delay", 250*time.Millisecond, "extra time the report spends in the database, to make it long work")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkLoopback(*addr); err != nil {
		return err
	}

	if *dsn == "" {
		startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		srv, err := pgserver.Start(startCtx)
		cancel()
		if err != nil {
			return err
		}
		defer srv.Close()
		*dsn = srv.DSN()
	}

	pool, err := pgxlanes.New(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	routes := []struct {
		pattern, tag string
		handler      func(*app, http.ResponseWriter, *http.Request) error
	}{
		{"GET /items/{id}", "item", (*app).item},
		{"POST /orders", "order", (*app).order},
		{"GET /report", "report", (*app).report},
	}
	tags := make([]string, len(routes))
	for i, rt := range routes {
		tags[i] = rt.tag
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewCollector(pool, metrics.WithPoolName("app"), metrics.WithTags(tags...)),
	)

	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = setup(setupCtx, pool)
	cancel()
	if err != nil {
		return fmt.Errorf("setting up the schema: %w", err)
	}

	a := &app{pool: pool, reportDelay: *reportDelay}
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.Handle(rt.pattern, withTag(rt.tag, a.handler(rt.handler)))
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("GET /debug/pgxlanes", statuspage.New(pool, statuspage.WithName("httpservice")))

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	slog.Info("httpservice: listening", "addr", "http://"+ln.Addr().String())
	if ready != nil {
		ready(ln.Addr().String())
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	slog.Info("httpservice: shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// checkLoopback refuses any listen address but 127.0.0.1: this is an example, not to be exposed.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %w", addr, err)
	}
	if host != "127.0.0.1" {
		return fmt.Errorf("-addr %q: the example listens on 127.0.0.1 only", addr)
	}
	return nil
}

// withTag is the middleware that puts a route's tag on the request's context: every pool call
// the handler makes carries it into logs, errors and metrics.
func withTag(tag string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(pgxlanes.WithTag(r.Context(), tag)))
	})
}

func setup(ctx context.Context, pool *pgxlanes.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			create table if not exists items (id int primary key, name text not null, stock int not null);
			create table if not exists orders (id bigserial primary key, item_id int not null references items,
				created_at timestamptz not null default now());
			insert into items select n, 'item ' || n, 1000 from generate_series(1, 100) n on conflict do nothing`)
		return err
	})
}

type app struct {
	pool        *pgxlanes.Pool
	reportDelay time.Duration
}

// httpError is an error with the status to answer.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// handler adapts a handler that returns an error. A failed acquire (the lane's timeout, or its
// queue full) is 503 with Retry-After: the service is saturated, and clients should back off.
func (a *app) handler(h func(*app, http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(a, w, r)
		var he *httpError
		switch {
		case err == nil:
		case errors.As(err, &he):
			http.Error(w, he.msg, he.status)
		case errors.Is(err, pgxlanes.ErrAcquireTimeout), errors.Is(err, pgxlanes.ErrLaneFull):
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy, retry later", http.StatusServiceUnavailable)
			slog.Warn("httpservice: no connection", "path", r.URL.Path, "err", err)
		case r.Context().Err() != nil:
			// The client went away; nobody reads the answer.
		default:
			http.Error(w, "internal error", http.StatusInternalServerError)
			slog.Error("httpservice: request failed", "path", r.URL.Path, "err", err)
		}
	})
}

type item struct {
	ID    int    `json:"id"`
	Name  string `json:"name"`
	Stock int    `json:"stock"`
}

// item is a lookup: one plain query, so the Short lane.
func (a *app) item(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		return &httpError{http.StatusBadRequest, "bad item id"}
	}
	var it item
	err = a.pool.QueryRow(r.Context(), "select id, name, stock from items where id = $1", id).Scan(&it.ID, &it.Name, &it.Stock)
	if errors.Is(err, pgx.ErrNoRows) {
		return &httpError{http.StatusNotFound, "no such item"}
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, it)
	return nil
}

// order is a transaction, so the Tx lane: Begin goes there unless the context names a lane.
func (a *app) order(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.Atoi(r.FormValue("item"))
	if err != nil {
		return &httpError{http.StatusBadRequest, "bad item id"}
	}
	var orderID int64
	var stock int
	err = pgx.BeginFunc(r.Context(), a.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(r.Context(), "update items set stock = stock - 1 where id = $1 and stock > 0 returning stock", id).Scan(&stock); err != nil {
			return err
		}
		return tx.QueryRow(r.Context(), "insert into orders (item_id) values ($1) returning id", id).Scan(&orderID)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return &httpError{http.StatusConflict, "no such item, or out of stock"}
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"order": orderID, "item": id, "stock": stock})
	return nil
}

// report is long work, so it is annotated for the Long lane: it cannot take the connections
// that lookups and orders need, and waits behind other reports only.
func (a *app) report(w http.ResponseWriter, r *http.Request) error {
	ctx := pgxlanes.WithLane(r.Context(), pgxlanes.Long)
	rows, err := a.pool.Query(ctx, `
		select i.id, i.name, count(o.id) as orders
		from items i left join orders o on o.item_id = i.id, pg_sleep($1)
		group by i.id, i.name order by orders desc, i.id limit 10`, a.reportDelay.Seconds())
	if err != nil {
		return err
	}
	type line struct {
		ID     int    `json:"id"`
		Name   string `json:"name"`
		Orders int64  `json:"orders"`
	}
	lines, err := pgx.CollectRows(rows, pgx.RowToStructByPos[line])
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, lines)
	return nil
}

// writeJSON answers v. An error writing it means the client is gone: there is nobody to tell.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
