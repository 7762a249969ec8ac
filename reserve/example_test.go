package reserve_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// Four slots: short reserves one and may borrow; tx reserves two and may not take short's reserve;
// one slot is shared.
func Example() {
	p, err := reserve.New(reserve.Config{Size: 4, Lanes: []reserve.LaneConfig{
		{Name: "short", Reserved: 1, Bounded: true, AcquireTimeout: 10 * time.Millisecond},
		{Name: "tx", Reserved: 2, AcquireTimeout: 10 * time.Millisecond},
	}})
	if err != nil {
		panic(err)
	}
	const short, tx = 0, 1
	ctx := context.Background()

	// Short traffic spikes while tx is idle: short borrows tx's idle reserve.
	var shorts []reserve.Slot
	for range 4 {
		s, _ := p.Acquire(ctx, short)
		shorts = append(shorts, s)
	}
	fmt.Println("short holds", p.LaneStat(short).InUse, "of 4, borrowed", p.LaneStat(short).Borrowed)
	for _, s := range shorts {
		p.Release(s)
	}

	// Transactions pile up: tx gets its reserve and the shared slot, never short's reserve.
	var txs []reserve.Slot
	for range 4 {
		s, err := p.Acquire(ctx, tx)
		if errors.Is(err, reserve.ErrAcquireTimeout) {
			fmt.Println("tx refused:", err.(*reserve.AcquireError).InUse, "in use, short's reserve kept")
			continue
		}
		txs = append(txs, s)
	}
	s, err := p.Acquire(ctx, short)
	fmt.Println("short still gets a slot:", err == nil)
	p.Release(s)
	for _, s := range txs {
		p.Release(s)
	}
	// Output:
	// short holds 4 of 4, borrowed 3
	// tx refused: 3 in use, short's reserve kept
	// short still gets a slot: true
}
