// Command starvation reproduces head-of-line blocking in a connection pool and shows what lanes
// do about it. On one PostgreSQL, with the same total number of connections for every contender,
// it runs the same workload against
//
//  1. plain pgxpool;
//  2. two pgxpools, fast and heavy, splitting the same total (the usual hand-made workaround);
//  3. pgxlanes with its default lanes, learning slow statements (the default);
//  4. in the slow phase only, pgxlanes with learning off (lane_short_slow_threshold=0);
//  5. in the priority phase only, pgxlanes with priorities off (lane_short_priority_age=0,
//     lane_tx_priority_age=0: FIFO);
//
// and, as a baseline, the same short lookups on an idle pgxlanes pool.
//
// The workload has long transactions that lock a row with SELECT ... FOR UPDATE, hold it for
// seconds of application work and commit, enough of them to fill the pool, and short primary-key
// lookups on other rows, issued open-loop at a fixed rate: latency is measured from the time a
// lookup was scheduled, so waiting for a connection shows up as latency. A burst phase then lightens
// the long load and spikes the short traffic, to show what borrowing idle connections buys over a
// fixed split. A slow phase then replaces the transactions with a slow statement nobody annotated:
// clients run "select pg_sleep(1.5)" through QueryRow back to back, which fills a pool of 8 unless
// the pool learns that the statement is slow. Its first seconds, the learning window, are also
// reported on their own, and are in the slow phase's figures and verdict; the two-pool split sends
// the unannotated statement, like every plain query, to its fast pool. A priority phase then, on
// fresh pools, saturates Short and Tx with background work of low priority while a small stream
// of critical requests runs (priority.go).
//
// It prints a table, the ratios the project targets, writes the raw figures as JSON (-json) and
// draws the short-query latency of each contender (-plot). With no -dsn and no DATABASE_URL it
// starts a throwaway PostgreSQL with internal/pgserver. See docs/demo.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "starvation:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "starvation:", err)
		os.Exit(1)
	}
}

// usageError is a bad command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// config is the demo's command line. Every size is a flag; the defaults are scaled to a 2-core
// machine and a run of about a minute in all.
type config struct {
	dsn       string
	conns     int // total connections, the same for every contender
	fastConns int // the two-pool split's fast pool; heavy gets the rest
	rows      int

	longWorkers      int // concurrent long transactions in the steady phase
	burstLongWorkers int // concurrent long transactions during the burst
	longHold         time.Duration
	longJitter       float64 // each hold is longHold × (1 ± longJitter), the same sequence for every contender

	rate      float64       // short lookups per second in the steady phase
	burstRate float64       // short lookups per second during the burst
	burstWork time.Duration // server-side work (pg_sleep) of each lookup during the burst

	ramp       time.Duration // long transactions start, staggered, before the lookups do
	steady     time.Duration
	transition time.Duration // between steady and burst: the long load drops; not reported
	burst      time.Duration
	timeout    time.Duration // a lookup's deadline, counted from its scheduled time

	slowClients   int           // clients of the unannotated slow statement in the learn and slow phases
	slowSleep     time.Duration // the slow statement: select pg_sleep(slowSleep)
	learn         time.Duration // the learning window: the slow phase's first part, also reported on its own
	slow          time.Duration // the rest of the slow phase, after the learning window
	slowThreshold time.Duration // pgxlanes' lane_short_slow_threshold; 0: its default

	// The priority phase (priority.go).
	runMain, runPrio bool          // -phases
	prio             time.Duration // length of the critical stream
	prioRate         float64       // critical requests per second
	prioHold         time.Duration // a background call's hold: pg_sleep(prioHold)
	prioShortClients int           // background clients in Short
	prioTxClients    int           // background clients in Tx

	seed       uint64
	contenders []string
	jsonPath   string
	plotPath   string
	quiet      bool
}

func parseFlags(args []string, stderr io.Writer) (*config, *flag.FlagSet, error) {
	c := &config{}
	fs := flag.NewFlagSet("starvation", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: starvation [flags]\n\n"+
			"Runs the same workload against pgxpool, a two-pool split and pgxlanes (learning slow statements\n"+
			"or not), with the same total number of connections, and reports short-query latency.\n"+
			"See docs/demo.md.\n\nflags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.dsn, "dsn", os.Getenv("DATABASE_URL"), "PostgreSQL to use (default $DATABASE_URL; if empty, a throwaway server from the integration harness)")
	fs.IntVar(&c.conns, "conns", 8, "total connections of every contender (pool_max_conns)")
	fs.IntVar(&c.fastConns, "fast-conns", 2, "connections of the two-pool split's fast pool; the heavy pool gets the rest")
	fs.IntVar(&c.rows, "rows", 10000, "rows in the demo table")
	fs.IntVar(&c.longWorkers, "long-workers", 16, "concurrent long transactions in the steady phase (each locks its own row)")
	fs.IntVar(&c.burstLongWorkers, "burst-long-workers", 3, "concurrent long transactions during the transition and burst")
	fs.DurationVar(&c.longHold, "long-hold", 2*time.Second, "how long a long transaction holds its row lock (application work)")
	fs.Float64Var(&c.longJitter, "long-jitter", 0.2, "each hold is long-hold × (1 ± long-jitter), the same sequence for every contender")
	fs.Float64Var(&c.rate, "rate", 300, "short lookups per second in the steady and transition phases")
	fs.Float64Var(&c.burstRate, "burst-rate", 600, "short lookups per second during the burst")
	fs.DurationVar(&c.burstWork, "burst-work", 5*time.Millisecond, "server-side work (pg_sleep) of each lookup during the burst")
	fs.DurationVar(&c.ramp, "ramp", 500*time.Millisecond, "time for the long transactions to fill the pool before the lookups start")
	fs.DurationVar(&c.steady, "steady", 3*time.Second, "length of the steady phase")
	fs.DurationVar(&c.transition, "transition", 0, "length of the transition, while the long load drops (0: long-hold × (1 + long-jitter))")
	fs.DurationVar(&c.burst, "burst", 2*time.Second, "length of the burst phase")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "deadline of a lookup, from its scheduled time")
	fs.IntVar(&c.slowClients, "slow-clients", 12, "clients running the unannotated slow statement back to back in the learn and slow phases")
	fs.DurationVar(&c.slowSleep, "slow-sleep", 1500*time.Millisecond, "the unannotated slow statement is select pg_sleep(this)")
	fs.DurationVar(&c.learn, "learn", 2*time.Second, "the learning window, the first part of the slow phase: reported on its own too, and in the slow phase's figures and verdict")
	fs.DurationVar(&c.slow, "slow", 3*time.Second, "length of the slow phase after the learning window (the phase is -learn + -slow long)")
	fs.DurationVar(&c.slowThreshold, "slow-threshold", 0, "pgxlanes' lane_short_slow_threshold for the pgxlanes contenders that learn (0: pgxlanes' default)")
	phases := fs.String("phases", "main,priority", "the phases to run: main (steady, burst, learning and slow) and priority (background work of low priority and critical requests)")
	fs.DurationVar(&c.prio, "priority", 3*time.Second, "length of the priority phase's critical stream, per contender")
	fs.Float64Var(&c.prioRate, "priority-rate", 50, "critical requests per second in the priority phase (half lookups in Short, half transactions in Tx)")
	fs.DurationVar(&c.prioHold, "priority-hold", 50*time.Millisecond, "how long each background call of the priority phase holds its connection, ±50 % (select pg_sleep)")
	fs.IntVar(&c.prioShortClients, "priority-short-clients", 24, "background clients of low priority in Short in the priority phase, back to back")
	fs.IntVar(&c.prioTxClients, "priority-tx-clients", 12, "background clients of low priority in Tx (transactions) in the priority phase, back to back")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the lookup keys and hold times")
	only := fs.String("contenders", strings.Join(contenderNames, ","), "the contenders to run, in order (comma-separated)")
	fs.StringVar(&c.jsonPath, "json", "", "write the raw figures to this JSON file")
	fs.StringVar(&c.plotPath, "plot", "demo-report.png", "draw the latency picture to this file (.png or .svg; a relative path is from the working directory, examples/ under make demo); empty for none")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, err
		}
		return nil, nil, usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, nil, usageError{fmt.Sprintf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
	}
	for _, name := range strings.Split(*only, ",") {
		if name = strings.TrimSpace(name); name != "" {
			c.contenders = append(c.contenders, name)
		}
	}
	for _, ph := range strings.Split(*phases, ",") {
		switch strings.TrimSpace(ph) {
		case "main":
			c.runMain = true
		case "priority":
			c.runPrio = true
		case "":
		default:
			return nil, nil, usageError{fmt.Sprintf("-phases: unknown phase %q (phases are main, priority)", ph)}
		}
	}
	if c.transition == 0 {
		c.transition = maxHold(c)
	}
	return c, fs, c.validate()
}

func (c *config) validate() error {
	bad := func(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }
	switch {
	case c.conns < 2:
		return bad("-conns must be at least 2, got %d", c.conns)
	case c.fastConns < 1 || c.fastConns >= c.conns:
		return bad("-fast-conns must be between 1 and -conns - 1 (%d), got %d", c.conns-1, c.fastConns)
	case c.longWorkers < 1:
		return bad("-long-workers must be at least 1, got %d", c.longWorkers)
	case c.burstLongWorkers < 0 || c.burstLongWorkers > c.longWorkers:
		return bad("-burst-long-workers must be between 0 and -long-workers (%d), got %d", c.longWorkers, c.burstLongWorkers)
	case c.rows < c.longWorkers+10:
		return bad("-rows must be at least -long-workers + 10 (%d), got %d", c.longWorkers+10, c.rows)
	case c.longHold <= 0:
		return bad("-long-hold must be positive")
	case c.longJitter < 0 || c.longJitter >= 1:
		return bad("-long-jitter must be in [0, 1), got %v", c.longJitter)
	case c.rate <= 0 || c.burstRate <= 0:
		return bad("-rate and -burst-rate must be positive")
	case c.burstWork < 0:
		return bad("-burst-work must not be negative")
	case c.steady <= 0 || c.burst <= 0 || c.ramp < 0 || c.transition < 0:
		return bad("-steady and -burst must be positive, -ramp and -transition not negative")
	case c.timeout <= 0:
		return bad("-timeout must be positive")
	case c.slowClients < 1:
		return bad("-slow-clients must be at least 1, got %d", c.slowClients)
	case c.slowSleep <= 0 || c.slow <= 0 || c.learn < 0 || c.slowThreshold < 0:
		return bad("-slow-sleep and -slow must be positive, -learn and -slow-threshold not negative")
	case !c.runMain && !c.runPrio:
		return bad("-phases names none")
	case c.prio <= 0 || c.prioRate <= 0 || c.prioHold <= 0:
		return bad("-priority, -priority-rate and -priority-hold must be positive")
	case c.prioShortClients < 1 || c.prioTxClients < 1:
		return bad("-priority-short-clients and -priority-tx-clients must be at least 1, got %d and %d", c.prioShortClients, c.prioTxClients)
	case len(c.contenders) == 0:
		return bad("-contenders names none")
	case c.plotPath != "" && !strings.HasSuffix(c.plotPath, ".png") && !strings.HasSuffix(c.plotPath, ".svg"):
		return bad("-plot must name a .png or .svg file, got %q", c.plotPath)
	}
	for _, name := range c.contenders {
		if !slices.Contains(contenderNames, name) {
			return bad("-contenders: unknown contender %q (contenders are %s)", name, strings.Join(contenderNames, ", "))
		}
	}
	return nil
}

// run is the whole program: main is a thin wrapper so that tests can run it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, fs, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logf := func(format string, a ...any) {
		if !cfg.quiet {
			fmt.Fprintf(stderr, format+"\n", a...)
		}
	}

	dsn := cfg.dsn
	if dsn == "" {
		logf("no -dsn and no DATABASE_URL: starting a throwaway PostgreSQL")
		sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		srv, err := pgserver.Start(sctx)
		cancel()
		if err != nil {
			return err
		}
		defer srv.Close()
		if dsn, err = srv.CreateDatabase(ctx); err != nil {
			return err
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_ = srv.DropDatabase(dctx, dsn)
		}()
	}

	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := createTable(ctx, admin, cfg.rows); err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = admin.Exec(dctx, "drop table if exists "+tableName)
	}()

	d := &demo{cfg: cfg, dsn: dsn, admin: admin, logf: logf}
	rep := &report{Machine: machineInfo(ctx, admin), Flags: flagValues(fs), Args: redactArgs(args)}
	logf("%d connections per contender; %d long transactions holding a row for ~%v; %g lookups/s, burst %g lookups/s with %v of work each; then %d clients of %q",
		cfg.conns, cfg.longWorkers, cfg.longHold, cfg.rate, cfg.burstRate, cfg.burstWork, cfg.slowClients, slowSQL(cfg))
	specs, err := contenders(cfg)
	if err != nil {
		return err
	}
	for _, spec := range specs {
		var res *contenderResult
		if cfg.runMain && (spec.tx || spec.slow) {
			if res, err = d.runContender(ctx, spec); err != nil {
				return fmt.Errorf("%s: %w", spec.name, err)
			}
		}
		if cfg.runPrio && spec.prio {
			pr, errs, err := d.runPriority(ctx, spec)
			if err != nil {
				return fmt.Errorf("%s, priority phase: %w", spec.name, err)
			}
			if res == nil {
				res = &contenderResult{Name: spec.name, About: spec.about, Load: spec.load, Errors: map[string]string{}}
			}
			res.Priority = pr
			for k, v := range errs {
				res.Errors["priority "+k] = v
			}
		}
		if res != nil {
			rep.Contenders = append(rep.Contenders, res)
		}
	}
	rep.compute()

	rep.printTable(stdout, cfg)
	if cfg.jsonPath != "" {
		if err := rep.writeJSON(cfg.jsonPath); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nraw figures: %s\n", absPath(cfg.jsonPath))
	}
	if cfg.plotPath != "" {
		if err := drawPlot(rep, cfg, cfg.plotPath); err != nil {
			return fmt.Errorf("drawing %s: %w", cfg.plotPath, err)
		}
		fmt.Fprintf(stdout, "picture: %s\n", absPath(cfg.plotPath))
	}
	if rep.Verdict == "fail" {
		return verdictError{rep.failedChecks()}
	}
	return nil
}

// absPath returns path made absolute, or path itself if that fails: `make demo` runs the demo from
// examples/ (a module of its own), so a relative path printed as given would point the reader at
// the wrong directory.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// flagValues returns every flag's value, defaults included, for the JSON report.
func flagValues(fs *flag.FlagSet) map[string]string {
	m := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "dsn" { // it may carry a password
			m[f.Name] = f.Value.String()
		}
	})
	return m
}

// redactArgs returns args with the value of -dsn replaced: it may carry a password.
func redactArgs(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "dsn" {
			continue
		}
		if hasValue {
			out[i] = a[:strings.Index(a, "=")+1] + "REDACTED"
		} else if i+1 < len(out) {
			out[i+1] = "REDACTED"
		}
	}
	return out
}
