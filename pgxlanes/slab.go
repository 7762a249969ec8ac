package pgxlanes

import (
	"sync"

	"github.com/jackc/pgx/v5"
)

// Leases are reused: an acquire takes one from leases and its end puts it back (recycle), so that
// the hot path allocates no lease and leaves the collector nothing to scan. What a caller keeps is
// a wrapper (Conn, rows, row, tx), not the lease: a wrapper is small, comes from a slab that its
// lease carries, as pgxpool allocates its Conn wrappers 128 at a time, and is never handed out
// twice. It keeps its hold's generation, so that one kept past its hold finds it over
// (lease.stale) and returns ErrReleased, even once the lease serves another caller.
var leases = sync.Pool{New: func() any { return new(lease) }}

// newLeaseValue returns a lease that no hold uses, its generation fresh.
func newLeaseValue() *lease { return leases.Get().(*lease) }

// recycle puts the lease back for another acquire, once its hold is over and nobody will touch it
// again but through a generation check: its owner released it (phase released or ended), its
// end ran, and no action of the guard is under way on it. The hold's fields are zeroed first
// (they let go of the connection and the pool), then the generation moves on and the phase goes
// back to active, in one store: a wrapper or guard action that checks the generation meanwhile
// finds the hold over either way.
func (l *lease) recycle() {
	l.hold = hold{}
	for {
		s := l.st.Load()
		if l.st.CompareAndSwap(s, (s>>genShift+1)<<genShift|uint64(phActive)) {
			break
		}
	}
	leases.Put(l)
}

// wrapperSlabSize is how many wrappers of a kind one allocation makes.
const wrapperSlabSize = 32

// wrappers are a lease's slabs of fresh wrappers. Only the lease's holder takes from them, so
// they need no lock. A slab array stays in memory while any wrapper in it is referenced.
type wrappers struct {
	conns []Conn
	rows  []leaseRows
	row   []leaseRow
	txs   []leaseTx
}

// take returns a fresh element of *slab, refilling it when empty.
func take[T any](slab *[]T) *T {
	if len(*slab) == 0 {
		*slab = make([]T, wrapperSlabSize)
	}
	x := &(*slab)[0]
	*slab = (*slab)[1:]
	return x
}

// newConn returns the held connection of the lease's current hold.
func (l *lease) newConn() *Conn {
	c := take(&l.wrappers.conns)
	*c = Conn{l: l, gen: l.gen(), lane: l.rt.lane}
	return c
}

// newRows returns rows of the lease's current hold; release: they end the hold when done.
func (l *lease) newRows(rows pgx.Rows, release bool) *leaseRows {
	r := take(&l.wrappers.rows)
	*r = leaseRows{Rows: rows, l: l, gen: l.gen(), release: release}
	return r
}

// newRow returns a row of the lease's current hold; release: its Scan ends the hold.
func (l *lease) newRow(row pgx.Row, release bool) *leaseRow {
	r := take(&l.wrappers.row)
	*r = leaseRow{r: row, l: l, gen: l.gen(), release: release}
	return r
}

// newTx returns a transaction of the lease's current hold; release: Commit and Rollback end the
// hold.
func (l *lease) newTx(t pgx.Tx, release bool) *leaseTx {
	tx := take(&l.wrappers.txs)
	*tx = leaseTx{t: t, l: l, gen: l.gen(), release: release}
	return tx
}
