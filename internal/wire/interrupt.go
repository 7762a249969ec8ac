package wire

import (
	"context"
	"fmt"
	"time"
)

// cancelCode and cancelMessage are what the server itself says of a cancelled statement; the
// synthetic end of an interrupted request says the same.
const (
	cancelCode    = "57014"
	cancelMessage = "canceling statement due to user request"
)

// HandleCancel interrupts the request in flight because ctx ended: it implements pgconn's
// ctxwatch.Handler, so that the caller gets control back at once with the connection kept.
func (c *Conn) HandleCancel(ctx context.Context) { c.Interrupt(ctx.Err()) }

// HandleUnwatchAfterCancel ends an interrupt that found nothing to do: the request had already
// ended. It implements pgconn's ctxwatch.Handler.
func (c *Conn) HandleUnwatchAfterCancel() { c.ClearInterrupt() }

// Interrupt ends the request in flight, if any, as described in the package documentation;
// cause is what Cause returns afterwards. With no request in flight, the next request is ended as
// soon as it is sent, until ClearInterrupt. Interrupt does no network I/O and does not wait.
func (c *Conn) Interrupt(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != stateReady {
		return
	}
	c.intr = cause
	switch {
	case c.reading || c.writing:
		// Wake the reader or writer; the reader consumes the interrupt, a writer breaks.
		_ = c.Conn.SetDeadline(time.Now())
	case len(c.reqs) > 0:
		_ = c.consumeLocked()
	}
}

// ClearInterrupt drops an interrupt that no request consumed.
func (c *Conn) ClearInterrupt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.intr == nil {
		return
	}
	c.intr = nil
	if c.st == stateReady {
		_ = c.Conn.SetDeadline(time.Time{})
	}
}

// consumeLocked acts on a pending interrupt: with a request of pgconn's in flight, it queues a
// synthetic end of it for pgconn and starts a drain; with none, it returns a timeout for the
// reader, as a socket deadline would. It breaks the Conn when pgconn is in the middle of a
// message whose rest has not arrived. Caller must hold c.mu.
func (c *Conn) consumeLocked() error {
	cause := c.intr
	c.intr = nil
	_ = c.Conn.SetDeadline(time.Time{})
	owned := 0
	for _, q := range c.reqs {
		if !q.swallow {
			owned++
		}
	}
	if owned == 0 {
		return timeoutError{}
	}
	if c.cur > c.w-c.r {
		c.breakLocked(timeoutError{})
		return timeoutError{}
	}
	// The rest of a message pgconn has begun, then an error and a ReadyForQuery per request.
	c.out = append(c.out[:0], c.rbuf[c.r:c.r+c.cur]...)
	c.r += c.cur
	c.cur = 0
	c.out = appendError(c.out, cancelCode, cancelMessage)
	tx := c.tx
	if tx != 'I' {
		tx = 'E' // a statement that fails inside a transaction block aborts it
	}
	for range owned {
		c.out = appendReady(c.out, tx)
	}
	for i := range c.reqs {
		c.reqs[i].swallow = true
	}
	c.tx = tx
	c.cause = cause
	c.st = stateDraining
	c.cleaned = make(chan struct{})
	go c.drain(time.Now().Add(c.opts.Grace), tx)
	return nil
}

// drain reads and drops the replies of the requests an interrupt ended, after a cancel request,
// then makes the Conn ready again, or breaks it when the session may not be what pgconn believes.
// It runs on its own goroutine; while the Conn is draining nothing else touches rbuf or the socket.
//
// A cancel that reaches the backend before it starts the statement (while it still reads the
// request) is ignored by the server, so the cancel is sent again while replies are outstanding,
// at growing intervals. That is safe: nothing new is sent on the session until the drain ends,
// and each cancel is acknowledged (the backend signalled) before the next read.
func (c *Conn) drain(deadline time.Time, told byte) {
	ok := c.skip() // what is already buffered may end it all
	acked := true
	var err error
	for wait := 20 * time.Millisecond; !ok && err == nil; wait = min(2*wait, 250*time.Millisecond) {
		if !c.opts.NoCancel && c.cancel != nil {
			acked = c.sendCancel(deadline)
			if !acked {
				break
			}
		}
		until := deadline
		if t := time.Now().Add(wait); !c.opts.NoCancel && t.Before(deadline) {
			until = t
		}
		ok, err = c.read(until)
		if err != nil && isTimeout(err) && time.Now().Before(deadline) {
			err = nil // not answered yet: cancel again
		}
	}

	c.mu.Lock()
	mutated := c.mutatedLocked()
	clean := ok && err == nil && acked && c.srv == told && !mutated
	if clean {
		c.st = stateReady
		c.cond.Broadcast()
	} else {
		switch {
		case err != nil:
			err = fmt.Errorf("%w: reading the server's replies: %w", errBroken, err)
		case !acked:
			err = fmt.Errorf("%w: the server did not acknowledge the cancel request", errBroken)
		case mutated:
			err = fmt.Errorf("%w: it created or closed a named prepared statement", errBroken)
		default:
			err = fmt.Errorf("%w: transaction status %q, pgconn was told %q", errBroken, c.srv, told)
		}
		c.breakLocked(err)
	}
	close(c.cleaned)
	fs := c.onClean
	c.onClean = nil
	c.mu.Unlock()
	for _, f := range fs {
		f(clean)
	}
}

// sendCancel sends a cancel request and reports whether it is safe to go on: the server
// acknowledged it (it has signalled the backend), or nothing was sent.
func (c *Conn) sendCancel(deadline time.Time) bool {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err := c.cancel(ctx)
	// pgconn's CancelRequest returns nil after reading until the server closes the cancel
	// connection, which it does once it has signalled the backend, or when ctx ended. Only the
	// first is an acknowledgement. An error means nothing was sent.
	if err != nil {
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	if c.opts.Settle > 0 {
		time.Sleep(c.opts.Settle)
	}
	return true
}

// read reads replies until every request is answered or until passes.
func (c *Conn) read(until time.Time) (bool, error) {
	_ = c.Conn.SetReadDeadline(until)
	defer func() { _ = c.Conn.SetReadDeadline(time.Time{}) }()
	for {
		if c.r == c.w {
			c.r, c.w = 0, 0
		} else if c.w == len(c.rbuf) {
			c.w = copy(c.rbuf, c.rbuf[c.r:c.w])
			c.r = 0
		}
		n, err := c.Conn.Read(c.rbuf[c.w:])
		c.w += n
		if c.skip() {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// skip drops the whole messages in rbuf that belong to the requests being drained and reports
// whether every request has been answered. Notifications and parameter changes are kept for
// pgconn. A message larger than rbuf is dropped as it arrives.
func (c *Conn) skip() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.reqs) > 0 {
		if c.cur > 0 { // the rest of a large message being dropped
			k := min(c.cur, c.w-c.r)
			c.r, c.cur = c.r+k, c.cur-k
			if c.cur > 0 {
				return false
			}
			continue
		}
		typ, size, ok := header(c.rbuf[c.r:c.w])
		if !ok {
			return false
		}
		if c.w-c.r < size {
			if size <= len(c.rbuf) {
				return false
			}
			c.cur = size
			continue
		}
		body := c.rbuf[c.r+headerLen : c.r+size]
		switch {
		case typ == beNotification || typ == beParamStatus:
			c.out = append(c.out, c.rbuf[c.r:c.r+size]...)
		case typ == beReady:
			if len(body) == 1 {
				c.srv = body[0]
			}
			if c.reqs[0].mutates {
				c.mutated = true
			}
			c.popLocked()
		}
		c.r += size
	}
	return true
}

// mutatedLocked reports whether a drained request created or closed named prepared statements.
// Caller must hold c.mu.
func (c *Conn) mutatedLocked() bool {
	m := c.mutated
	c.mutated = false
	return m
}
