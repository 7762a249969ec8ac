package reserve_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// Four slots: short reserves one and may borrow; tx reserves two and may not take short's
// reserve; one slot is shared.
func Example() {
	cfg := reserve.Config{Size: 4, Lanes: []reserve.LaneConfig{
		{Name: "short", Reserved: 1, Bounded: true},
		{Name: "tx", Reserved: 2},
	}}
	p, err := reserve.New(cfg)
	if err != nil {
		panic(err)
	}
	short, _ := p.Lane("short")
	tx, _ := p.Lane("tx")
	ctx := context.Background()
	fmt.Println("short can reach", cfg.Reachable(short.Index()), "slots, tx", cfg.Reachable(tx.Index()))

	// Short traffic spikes while tx is idle: short borrows tx's idle reserve.
	var shorts []reserve.Slot
	for range 4 {
		s, _ := short.Acquire(ctx)
		shorts = append(shorts, s)
	}
	st := short.Stat()
	fmt.Println("short holds", st.InUse, "of 4, borrowed", st.Borrowed)
	for _, s := range shorts {
		s.Release()
	}

	// Transactions pile up: tx gets its reserve and the shared slot, never short's reserve.
	var txs []reserve.Slot
	for range 3 {
		s, _ := tx.Acquire(ctx)
		txs = append(txs, s)
	}
	_, ok := tx.TryAcquire()
	fmt.Println("a fourth tx may take short's reserve:", ok)

	s, err := short.Acquire(ctx)
	fmt.Println("short still gets a slot:", err == nil, "without waiting:", !s.Waited())
	s.Release()

	// A tx caller that may not wait is refused with the lane's figures.
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = tx.Acquire(ctx)
	fmt.Println(errors.Is(err, context.Canceled), err)
	for _, s := range txs {
		s.Release()
	}
	// Output:
	// short can reach 4 slots, tx 3
	// short holds 4 of 4, borrowed 3
	// a fourth tx may take short's reserve: false
	// short still gets a slot: true without waiting: true
	// true reserve: tx lane: acquire gave up after 0s: context canceled (in use 3/3, waiting 0)
}
