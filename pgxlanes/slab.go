package pgxlanes

import "sync"

// leaseSlabSize is how many leases one allocation makes.
const leaseSlabSize = 32

// leaseSlab hands out fresh leases from an array, so that an acquire does not allocate one of its
// own: one allocation serves leaseSlabSize acquires, as pgxpool allocates its Conn wrappers 128
// at a time. A lease is never handed out twice: a wrapper kept past its release still finds its
// own lease ended and returns ErrReleased. An array stays in memory while any lease in it is
// referenced (at most leaseSlabSize × about 700 B).
type leaseSlab struct{ free []lease }

// slabs keeps one partly used slab per P, so that concurrent acquires do not contend.
var slabs = sync.Pool{New: func() any { return new(leaseSlab) }}

// newLeaseValue returns a zeroed lease that nothing else references.
func newLeaseValue() *lease {
	s := slabs.Get().(*leaseSlab)
	if len(s.free) == 0 {
		s.free = make([]lease, leaseSlabSize)
	}
	l := &s.free[0]
	s.free = s.free[1:]
	slabs.Put(s)
	return l
}
