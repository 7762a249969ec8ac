package pgxlanes

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// TestHoldersRegistry: the lock-holder registry keeps a lease by its slot's index while the
// index fits the slots' array, and by its PID past it; both are found by PID and listed, a
// lease is removed only by itself (not by an earlier lease that held the same slot), and a
// removed lease is found no more.
func TestHoldersRegistry(t *testing.T) {
	res, err := reserve.New(reserve.Config{Size: 3, Lanes: []reserve.LaneConfig{{Name: "tx", Reserved: 3}}})
	require.NoError(t, err)
	var slots []reserve.Slot
	for range 3 {
		s, err := res.AcquireAs(context.Background(), 0, reserve.Caller{})
		require.NoError(t, err)
		slots = append(slots, s)
	}
	h := holders{bySlot: make([]*lease, 2)} // slot index 2 is past the array
	leases := make(map[int]*lease)
	for _, s := range slots {
		l := testLease(s, uint32(100+s.Index()), kindTx)
		leases[s.Index()] = l
		h.add(l)
	}
	require.Len(t, h.byPID, 1, "the lease past the array is kept by PID")
	now := time.Now()
	for i, l := range leases {
		ls, ok := h.status(l.pid, now)
		require.True(t, ok, "slot %d", i)
		assert.Equal(t, l.pid, ls.PID)
		assert.Equal(t, "transaction", ls.Kind)
	}
	_, ok := h.status(999, now)
	assert.False(t, ok, "an unknown PID")
	_, ok = h.status(0, now)
	assert.False(t, ok, "PID 0")

	listed := func() []uint32 {
		h.mu.Lock()
		defer h.mu.Unlock()
		var pids []uint32
		h.eachLocked(func(l *lease) { pids = append(pids, l.pid) })
		return pids
	}
	assert.ElementsMatch(t, []uint32{100, 101, 102}, listed())

	// An earlier lease of slot 0 and of slot 2 (the same slot and PID, another lease: a held
	// connection whose lease was reused) removes neither the array's entry nor the map's.
	h.remove(testLease(slots[0], 100, kindTx))
	h.remove(testLease(slots[2], 102, kindHeld))
	assert.ElementsMatch(t, []uint32{100, 101, 102}, listed(), "a stale lease removes nothing")

	for _, i := range []int{0, 2} {
		h.remove(leases[i])
		_, ok := h.status(leases[i].pid, now)
		assert.False(t, ok, "slot %d removed", i)
	}
	assert.ElementsMatch(t, []uint32{101}, listed())
	assert.Empty(t, h.byPID)
}

// testLease is a lease in the Tx lane, of slot s, backend pid and the kind given.
func testLease(s reserve.Slot, pid uint32, kind callKind) *lease {
	return &lease{hold: hold{slot: s, pid: pid, kind: kind, rt: route{lane: Tx}}}
}

// BenchmarkHoldersAddRemove: registering and unregistering a Tx lease, as every Tx or Long
// lease does, by its slot's index (Registry=array, every slot below liveMax) and by its PID
// (Registry=map: slots past liveMax, and every slot before the array was added).
func BenchmarkHoldersAddRemove(b *testing.B) {
	res, err := reserve.New(reserve.Config{Size: 8, Lanes: []reserve.LaneConfig{{Name: "tx", Reserved: 8}}})
	require.NoError(b, err)
	var leases []*lease
	for i := range 8 {
		s, err := res.AcquireAs(context.Background(), 0, reserve.Caller{})
		require.NoError(b, err)
		leases = append(leases, testLease(s, uint32(1000+i), kindTx))
	}
	for _, registry := range []string{"array", "map"} {
		b.Run("Registry="+registry, func(b *testing.B) {
			h := holders{}
			if registry == "array" {
				h.bySlot = make([]*lease, 8)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				l := leases[i%len(leases)]
				h.add(l)
				h.remove(l)
				i++
			}
		})
	}
}
