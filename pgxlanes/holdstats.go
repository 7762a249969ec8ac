package pgxlanes

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// holdWindow is how long a window of hold times lasts: a lane's observed p99 covers the last one
// or two windows, so it follows the workload of the last minutes, not of the pool's whole life.
const holdWindow = time.Minute

// Hold times are counted in log-spaced buckets: four per power of two of nanoseconds (each about
// 19 % wide), from 1 µs to about 2.4 h. A p99 read from them is the upper bound of its bucket.
const (
	holdSub     = 4
	holdMinBits = 10 // durations under 2^10 ns fall in the first bucket
	holdBuckets = (43 - holdMinBits) * holdSub
)

// holdHist is one window's counts of one lane.
type holdHist [holdBuckets]atomic.Uint64

// holdStats keeps each lane's recent hold times, to report the observed p99 and the timeout the
// design notes advise (3 × p99). Every lease's end records its hold time with one atomic add
// (lease.done calls record directly, not as an Observer, so that a pool without observers builds
// no event). No allocation, no lock on the hot path but once a window.
//
// The windows lie on a fixed grid of holdWindow from the first hold recorded (or the first read),
// and a read covers the window now under way and the one before it. Both records and reads move
// to the window of their time: a pool whose p99 nobody reads for an hour still reports only the
// last minutes (when windows turned only as the p99 was read, one read after an hour covered
// the whole hour).
type holdStats struct {
	cur atomic.Int32 // the index in hist of the window being filled
	// hist[w][lane]: two windows that alternate.
	hist [2][numLanes]holdHist
	ends atomic.Int64 // when the window being filled ends (mono); 0 before the first use

	mu sync.Mutex // serialises rotations
}

// holdBucket returns the bucket of d.
func holdBucket(d time.Duration) int {
	ns := uint64(max(d, 0))
	n := bits.Len64(ns)
	if n <= holdMinBits {
		return 0
	}
	sub := int(ns>>(n-3)) & (holdSub - 1) // the two bits after the leading one
	return min((n-holdMinBits-1)*holdSub+sub+1, holdBuckets-1)
}

// holdUpper returns the upper bound of bucket b.
func holdUpper(b int) time.Duration {
	if b == 0 {
		return 1 << holdMinBits
	}
	b--
	n := b/holdSub + holdMinBits + 1 // bit length of the bucket's durations
	sub := b % holdSub
	return time.Duration((uint64(holdSub+sub+1) << (n - 3)))
}

// record counts a lease of lane l held for d, ended at now, in the lane's window of now.
func (h *holdStats) record(l Lane, d time.Duration, now mono) {
	if int64(now) >= h.ends.Load() {
		h.rotate(now)
	}
	if int(l) < numLanes {
		h.hist[h.cur.Load()][l][holdBucket(d)].Add(1)
	}
}

// p99 returns the 99th percentile of lane l's hold times in the window of now and the one before
// it, and the number of leases it is taken over; 0, 0 when none ended.
func (h *holdStats) p99(l Lane, now mono) (time.Duration, uint64) {
	if int64(now) >= h.ends.Load() {
		h.rotate(now)
	}
	var counts [holdBuckets]uint64
	var n uint64
	for w := range h.hist {
		for b := range counts {
			c := h.hist[w][l][b].Load()
			counts[b] += c
			n += c
		}
	}
	if n == 0 {
		return 0, 0
	}
	rank := n - n/100 // the smallest count that covers 99 %
	var seen uint64
	for b, c := range counts {
		seen += c
		if seen >= rank {
			return holdUpper(b), n
		}
	}
	return holdUpper(holdBuckets - 1), n
}

// rotate moves to the window of now once the current one is over: the older window is cleared
// and becomes the current one, and when a whole window passed with no record, the current one
// (older than the window before now's) is cleared too. A hold recorded during the clearing may
// be lost; p99 is an estimate.
func (h *holdStats) rotate(now mono) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ends, w := h.ends.Load(), int64(holdWindow)
	if ends == 0 {
		h.ends.Store(int64(now) + w)
		return
	}
	if int64(now) < ends {
		return // another record rotated first
	}
	cur := h.cur.Load()
	h.clear(1 - cur)
	if int64(now)-ends >= w {
		h.clear(cur)
	}
	h.cur.Store(1 - cur)
	h.ends.Store(ends + ((int64(now)-ends)/w+1)*w)
}

// clear empties window w of every lane.
func (h *holdStats) clear(w int32) {
	for l := range h.hist[w] {
		for b := range h.hist[w][l] {
			h.hist[w][l][b].Store(0)
		}
	}
}

// advisedTimeout is the design notes' advice for a timeout: about 3 × the p99 of the work.
func advisedTimeout(p99 time.Duration) time.Duration { return 3 * p99 }
