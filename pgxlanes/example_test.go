package pgxlanes_test

import (
	"context"
	"fmt"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// lane_<lane>_<setting> parameters override the lanes' defaults, which the pool sizes for
// pool_max_conns when it is created; they are not sent to the server. Like pgxpool, New does not
// connect before the first use.
func ExampleParseConfig() {
	cfg, err := pgxlanes.ParseConfig("postgres://app:secret@127.0.0.1/app?pool_max_conns=8&lane_tx_budget=10s&lane_tx_over_budget=terminate")
	if err != nil {
		panic(err)
	}
	pool, err := pgxlanes.NewWithConfig(context.Background(), cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	resolved := pool.Config()
	for _, l := range pgxlanes.Lanes() {
		lc := resolved.Lane(l)
		fmt.Printf("%-5s reserved %d, max %d, acquire timeout %v, budget %v (%v)\n",
			l, lc.Reserved, lc.MaxConns, lc.AcquireTimeout, lc.Budget, lc.OverBudget)
	}
	_, err = pgxlanes.ParseConfig("postgres://app:secret@127.0.0.1/app?lane_short_reserved=lots")
	fmt.Println(err)
	// Output:
	// short reserved 2, max 8, acquire timeout 1s, budget 6s (cancel)
	// tx    reserved 3, max 6, acquire timeout 10s, budget 10s (terminate)
	// long  reserved 0, max 1, acquire timeout 30s, budget 10m0s (flag)
	// pgxlanes: DSN parameter lane_short_reserved: "lots" is not a whole number ≥ 0
}

// Contexts choose the lane, the budget and a tag; middleware can read them back.
func ExampleWithLane() {
	ctx := pgxlanes.WithTag(pgxlanes.WithLane(context.Background(), pgxlanes.Long), "nightly-export")
	a := pgxlanes.AnnotationsFrom(ctx)
	fmt.Println(a.Lane, a.LaneSet, a.Tag)
	// Output: long true nightly-export
}

// A priority orders the callers waiting in one lane; metrics group priorities into four levels.
func ExampleWithPriority() {
	ctx := pgxlanes.WithPriority(context.Background(), pgxlanes.PriorityCritical)
	p := pgxlanes.AnnotationsFrom(ctx).Priority
	fmt.Println(p, p.Level(), pgxlanes.Priority(15).Level(), pgxlanes.Priority(-3).Level())
	// Output: critical critical high low
}
