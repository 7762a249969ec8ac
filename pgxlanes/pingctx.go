package pgxlanes

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pingCtx is the context of pgxpool's step of an acquire when that step may block: the caller's
// ctx, plus the lane's acquire timeout, armed only once pgxpool decides to ping an idle connection
// (its ShouldPing hook, wrapped in pgxpoolConfig). A ping of a frozen server must not hold the
// caller past the lane's timeout; but when pgxpool finds no idle connection it can use (none, or
// one past MaxConnLifetime, which it destroys at acquire), it dials, and a dial is bounded by
// ConnectTimeout, not by the lane's timeout: a slow link must not fail a Short call because a
// connection was being opened for it (docs/design.md, "Opening connections").
type pingCtx struct {
	context.Context               // the caller's
	bound           time.Duration // the lane's acquire timeout, from the ping's start
	done            chan struct{}
	stop            func() bool // stops the propagation of the caller's cancel

	mu       sync.Mutex
	err      error       // set when done is closed; guarded by mu
	deadline time.Time   // zero until armed; guarded by mu
	timer    *time.Timer // guarded by mu
}

type pingCtxKey struct{}

func newPingCtx(parent context.Context, bound time.Duration) *pingCtx {
	c := &pingCtx{Context: parent, bound: bound, done: make(chan struct{})}
	c.stop = context.AfterFunc(parent, func() { c.end(parent.Err()) })
	return c
}

// arm starts the lane's bound on the ping pgxpool is about to send.
func (c *pingCtx) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.timer != nil {
		return
	}
	// From now, not from the acquire's start: a dial may have come first (pgxpool pings a
	// connection it just opened if the dial took over a second), and it had a bound of its own.
	c.deadline = time.Now().Add(c.bound)
	c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
}

func (c *pingCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// release stops the timer and the propagation; the context is not used after it.
func (c *pingCtx) release() {
	c.stop()
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
}

func (c *pingCtx) Deadline() (time.Time, bool) {
	d, ok := c.Context.Deadline()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.deadline.IsZero() && (!ok || c.deadline.Before(d)) {
		return c.deadline, true
	}
	return d, ok
}

func (c *pingCtx) Done() <-chan struct{} { return c.done }

func (c *pingCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *pingCtx) Value(key any) any {
	if key == (pingCtxKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// shouldPing wraps pgxpool's ShouldPing (the user's, or pgxpool's default: a connection idle
// over a second): when pgxpool will ping, the lane's bound starts to apply to the acquire.
func shouldPing(user func(context.Context, pgxpool.ShouldPingParams) bool) func(context.Context, pgxpool.ShouldPingParams) bool {
	return func(ctx context.Context, params pgxpool.ShouldPingParams) bool {
		if w := wireOf(params.Conn.PgConn()); w != nil && w.ParkedFor != 0 {
			// Idle while parked too, before pgxpool had it back (park.go).
			params.IdleDuration += time.Duration(w.ParkedFor)
			w.ParkedFor = 0
		}
		var ping bool
		if user != nil {
			ping = user(ctx, params)
		} else {
			ping = params.IdleDuration > time.Second
		}
		if ping {
			if c, ok := ctx.Value(pingCtxKey{}).(*pingCtx); ok {
				c.arm()
			}
		}
		return ping
	}
}
