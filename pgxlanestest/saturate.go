package pgxlanestest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Saturation is the held connections of a SaturateLane. Its methods are safe for concurrent use.
type Saturation struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	held   atomic.Int32
	once   sync.Once
}

// SaturateLane acquires every connection that lane of pool can reach now, its reserve and what
// it may take beyond, and holds them, idle, until d has passed, Stop is called or the test ends.
// It returns once it holds them all, so that the lane's next caller waits (and fails after the
// lane's acquire timeout, or at once with ErrLaneFull once the lane's queue is full).
//
//	pgxlanestest.SaturateLane(t, pool, pgxlanes.Tx, 5*time.Second)
//	// transactions now fail after lane_tx_acquire_timeout; lookups do not notice
//
// What a lane can reach depends on what the other lanes hold: call it on a quiet pool, or
// expect fewer connections than the lane's MaxConns (Held says how many). The connections carry
// no budget (pgxlanes.WithBudget(ctx, pgxlanes.Off)), so that the guard does not end the
// saturation early. SaturateLane fails tb if lane is not one of pgxlanes.Lanes() or d is not
// positive, or if a connection cannot be opened.
func SaturateLane(tb testing.TB, pool *pgxlanes.Pool, lane pgxlanes.Lane, d time.Duration) *Saturation {
	tb.Helper()
	s, err := saturate(pool, lane, d)
	if err != nil {
		tb.Fatalf("pgxlanestest: SaturateLane: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func saturate(pool *pgxlanes.Pool, lane pgxlanes.Lane, d time.Duration) (*Saturation, error) {
	switch {
	case pool == nil:
		return nil, errors.New("pool is nil")
	case !slices.Contains(pgxlanes.Lanes(), lane):
		return nil, fmt.Errorf("lane %d is not a lane: want pgxlanes.Short, Tx or Long", lane)
	case d <= 0:
		return nil, fmt.Errorf("d = %v: want a positive duration", d)
	}
	st := pool.Stat().Lane(lane)
	want := st.MaxConns - st.InUse
	ctx, cancel := context.WithTimeout(context.Background(), d)
	s := &Saturation{cancel: cancel}

	// Every acquirer either gets a connection and holds it until ctx ends, or waits in the lane's
	// queue until settle is closed: then the lane cannot reach more now.
	settle, settled := context.WithCancel(ctx)
	defer settled()
	actx := pgxlanes.WithTag(pgxlanes.WithBudget(pgxlanes.WithLane(settle, lane), pgxlanes.Off), "pgxlanestest.SaturateLane")
	var failed, gone atomic.Int32
	errs := make(chan error, want)
	for range want {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			c, err := pool.Acquire(actx)
			// An acquire timeout that is shorter than opening a connection is no reason to stop.
			for errors.Is(err, pgxlanes.ErrAcquireTimeout) && settle.Err() == nil {
				c, err = pool.Acquire(actx)
			}
			if err != nil {
				if settle.Err() == nil {
					failed.Add(1)
					errs <- err
				}
				gone.Add(1)
				return
			}
			s.held.Add(1)
			<-ctx.Done()
			c.Release()
			s.held.Add(-1)
		}()
	}
	for {
		held, ended := int(s.held.Load()), int(gone.Load())
		if failed.Load() > 0 {
			s.Stop()
			return nil, fmt.Errorf("%s lane: %w", lane, <-errs)
		}
		pending := want - held - ended
		if pending == 0 || ctx.Err() != nil {
			return s, nil
		}
		// The acquirers still pending all wait in the lane's queue: it can reach no more now.
		// Withdraw them, and return once they are gone, so that none of them stays in the queue
		// ahead of the test's callers.
		if pool.Stat().Lane(lane).Waiting >= pending {
			settled()
			for int(s.held.Load()+gone.Load()) < want {
				time.Sleep(pollInterval)
			}
			return s, nil
		}
		time.Sleep(pollInterval)
	}
}

// Held returns how many connections the saturation holds now.
func (s *Saturation) Held() int { return int(s.held.Load()) }

// Stop releases every connection now and returns when all are back in the pool. It is safe to
// call more than once; the test's cleanup calls it.
func (s *Saturation) Stop() {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
	})
}
