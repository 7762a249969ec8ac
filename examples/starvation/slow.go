package main

// The unannotated slow statements of the learn and slow phases.

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// slowSQL is the slow statement. Its text is a constant, as an ORM's report or a count would be,
// so that pgxlanes sees one statement; it goes through QueryRow with no lane annotation.
func slowSQL(cfg *config) string {
	return fmt.Sprintf("select pg_sleep(%g)", cfg.slowSleep.Seconds())
}

// slowCall is one call of the slow statement. When the slow phase ends, a call still waiting for
// a connection is withdrawn (its context is cancelled); a call already running is left to finish,
// so that no contender loses a connection to a statement cancelled mid-flight (pgx closes a
// pgxpool connection whose query was interrupted). The mutex orders the two: the QueryTracer marks
// the call started under mu before pgx sends anything, and a withdrawal cancels the context under
// mu, so pgx either sees a started call left alone or a context already cancelled before it sends.
type slowCall struct {
	mu sync.Mutex
	// Guarded by mu:
	started, withdrawn bool
	cancel             context.CancelFunc
}

// slowCallKey carries a *slowCall in the call's context, for slowTracer.
type slowCallKey struct{}

// starting is called by the QueryTracer when the call has its connection.
func (c *slowCall) starting() {
	c.mu.Lock()
	if !c.withdrawn {
		c.started = true
	}
	c.mu.Unlock()
}

func (c *slowCall) withdraw() {
	c.mu.Lock()
	if !c.started {
		c.withdrawn = true
		c.cancel()
	}
	c.mu.Unlock()
}

func (c *slowCall) wasWithdrawn() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.withdrawn
}

// storm is the slow statements' clients: each runs the statement back to back until stop.
type storm struct {
	wg sync.WaitGroup
	mu sync.Mutex
	// Guarded by mu:
	stopped bool
	calls   map[*slowCall]struct{} // the calls in progress
}

// startStorm starts cfg.slowClients clients of the slow statement on q. A failed call is
// recorded and retried after 10 ms, so a client refused at once does not spin.
func (d *demo) startStorm(ctx context.Context, q querier, rec *recorder) *storm {
	s := &storm{calls: map[*slowCall]struct{}{}}
	sql := slowSQL(d.cfg)
	tagged := phaseContext(ctx, phaseSlowStmt) // a tag labels the call for the observer; it never picks a lane
	for range d.cfg.slowClients {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				cctx, c, ok := s.begin(tagged)
				if !ok {
					return
				}
				t0 := time.Now()
				var v any
				err := q.QueryRow(cctx, sql).Scan(&v)
				s.end(c)
				switch {
				case c.wasWithdrawn():
					rec.slowWithdrawn()
					return
				case err != nil && ctx.Err() != nil:
					return // the run's deadline: reported by runContender
				case err != nil:
					rec.slowEnded(t0, classify(err), err)
					sleepCtx(ctx, 10*time.Millisecond)
				default:
					rec.slowEnded(t0, kindOK, nil)
				}
			}
		}()
	}
	return s
}

// begin registers a new call; ok is false once the storm is stopped.
func (s *storm) begin(ctx context.Context) (context.Context, *slowCall, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, nil, false
	}
	c := &slowCall{}
	ctx, c.cancel = context.WithCancel(context.WithValue(ctx, slowCallKey{}, c))
	s.calls[c] = struct{}{}
	return ctx, c, true
}

func (s *storm) end(c *slowCall) {
	c.cancel()
	s.mu.Lock()
	delete(s.calls, c)
	s.mu.Unlock()
}

// stop ends the storm: no client starts another call, the waiting calls are withdrawn, the
// running ones finish. wait returns when every client has returned.
func (s *storm) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for c := range s.calls {
		c.withdraw()
	}
}

func (s *storm) wait() { s.wg.Wait() }
