// Package wire wraps the network connection under a pgconn.PgConn, so that pgxlanes can end a
// request at once without losing the server session, and change session settings without a
// round trip of their own. It knows only the framing of the PostgreSQL protocol (a type byte and
// a length per message, a ReadyForQuery closing every request) and does not import pgx.
//
// Three things happen here.
//
// Staging. Session settings (SET and RESET) go in the same write as the application's next
// request: Stage queues them before it, After queues a query right after it (SET LOCAL after a
// BEGIN). Their replies are read and dropped (swallowed), so a held connection on a lane with its
// own timeouts costs no round trip, and no tracer sees the queries.
//
// Interrupt. When a caller's context ends (HandleCancel, the pgconn ctxwatch handler) or the
// budget guard acts (Interrupt), a reader blocked in Read is woken. If a request is in flight, the
// reader gets a synthetic end of it at a message boundary: an ErrorResponse 57014 and one
// ReadyForQuery per request. pgconn stays consistent and the caller returns at once.
//
// Drain. In the background, the server's real replies are then read and dropped, after a cancel
// request. The connection is clean again once the cancel was acknowledged (the server has
// signalled the backend, so a late cancel cannot hit a later request) and every reply was read.
// Until then the Conn is draining: a write waits, and OnClean tells its owner when it is done. If
// the server does not answer within Options.Grace, or the session may no longer match what pgconn
// believes, the Conn breaks and its owner closes it.
package wire

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Options configure a Conn.
type Options struct {
	// ResetSQL restores the session defaults after Stage("") (RESET of every setting Stage sets).
	ResetSQL string
	// Grace bounds a drain: the server must answer the cancel and every request within it.
	Grace time.Duration
	// Settle is waited after an acknowledged cancel before the Conn is clean again. It is 0 for a
	// direct connection to PostgreSQL, which signals the backend before it acknowledges; a pooler
	// may acknowledge before it forwards the cancel.
	Settle time.Duration
	// NoCancel turns cancel requests off (a pooler that cannot take them): a drain then waits for
	// the request to end by itself, within Grace.
	NoCancel bool
}

type state uint8

const (
	stateStartup  state = iota // before the first ReadyForQuery: bytes pass through
	stateReady                 // requests are tracked
	stateDraining              // a request was ended early; its replies are being dropped
	stateBroken                // unusable: every call fails
)

// request is a sent request whose ReadyForQuery has not been read yet.
type request struct {
	swallow bool // its replies are dropped: a staged query, or a request ended early
	// mutates: it creates or closes named prepared statements, whose server state pgconn can no
	// longer know if the request is ended early.
	mutates bool
}

// streamAbove is the size beyond which a message handed to pgconn is passed through as it
// arrives instead of being buffered whole; an interrupt in the middle of one breaks the Conn.
const streamAbove = 256 << 10

// errBroken is returned by the calls of a broken Conn.
var errBroken = errors.New("wire: connection unusable after an interrupted request")

// Conn is a net.Conn that tracks requests and replies. It is safe for concurrent Read and Write,
// as pgconn's background reader requires.
type Conn struct {
	net.Conn
	opts   Options
	cancel func(context.Context) error // sends a cancel request for this session; nil: none

	wmu  sync.Mutex // serializes Write
	wbuf []byte     // a write with staged queries around it; guarded by wmu

	mu   sync.Mutex // guards everything below, except rbuf, r and w (see below)
	cond *sync.Cond // broadcast when a drain ends or the Conn breaks
	st   state
	err  error // why the Conn broke

	reqs []request // sent requests without their ReadyForQuery, oldest first
	tx   byte      // transaction status of the last ReadyForQuery handed to pgconn
	srv  byte      // transaction status of the last ReadyForQuery read from the server

	applied string // session settings the server has once every staged query is sent
	staged  string // settings to stage before the next request; == applied when none
	after   string // a query to send right after the next request
	failed  bool   // a swallowed query failed: the session is not what the owner staged

	wrem       int  // bytes left of the frontend message the last write ended in
	extOpen    bool // extended-protocol messages were sent since the last Sync
	extMutates bool // and one of them creates or closes a named prepared statement
	mutated    bool // a drained request had mutates set

	// rbuf[r:w] are bytes read from the server and not yet handed on. They are touched by the
	// reader while it holds mu or while it alone reads (reading), and by a drain while the Conn
	// is draining, when no reader touches them.
	rbuf    []byte
	r, w    int
	cur     int    // bytes of a message being handed to pgconn that it has not had yet
	out     []byte // bytes to hand to pgconn before any other: a synthetic end, stashed messages
	reading bool   // a reader is in a socket read without mu
	writing bool   // a writer is in a socket write

	intr    error         // a pending interrupt's cause
	cause   error         // cause of the last early end, until the next request
	cleaned chan struct{} // closed when the current drain ends
	onClean []func(ok bool)
}

// New wraps c.
func New(c net.Conn, opts Options) *Conn {
	w := &Conn{Conn: c, opts: opts, rbuf: make([]byte, 8192)}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// SetCancel sets the function that sends a cancel request for this session (pgconn's
// CancelRequest). It must be set before the first request.
func (c *Conn) SetCancel(f func(context.Context) error) {
	c.mu.Lock()
	c.cancel = f
	c.mu.Unlock()
}

// Session returns the session settings the server has once every staged query is sent: the
// target of the last Stage, or "" for the defaults.
func (c *Conn) Session() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.staged
}

// Stage makes the session settings target before the next request: target is a query of SET
// statements, "" for the defaults. Staging the settings already applied cancels a staged change.
func (c *Conn) Stage(target string) {
	c.mu.Lock()
	c.staged = target
	c.mu.Unlock()
}

// Pending reports whether staged settings or a queued query wait for the next request. A request
// written to the network past the Conn (pgconn's ExecBatch, where the Conn is the reader and
// writer of pgconn's frontend rather than its net.Conn) goes out without them.
func (c *Conn) Pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.staged != c.applied || c.after != ""
}

// After queues sql to be sent right after the next request, in the same write; "" drops a queued
// query that was not sent.
func (c *Conn) After(sql string) {
	c.mu.Lock()
	c.after = sql
	c.mu.Unlock()
}

// Failed reports whether a staged or queued query failed, so that the session may not have the
// settings its owner staged.
func (c *Conn) Failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

// Cause returns the cause of the last request ended early, until the next request is written.
func (c *Conn) Cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

// Broken reports whether the Conn is unusable.
func (c *Conn) Broken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st == stateBroken
}

// Err returns why the Conn broke, or nil.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != stateBroken {
		return nil
	}
	return c.err
}

// Draining reports whether the replies of a request ended early are still being dropped.
func (c *Conn) Draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st == stateDraining
}

// OnClean arranges for f to be called, on the drain's goroutine, when the current drain ends; ok
// is false if the Conn broke. It returns false, and does not call f, if no drain is under way.
func (c *Conn) OnClean(f func(ok bool)) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != stateDraining {
		return false
	}
	c.onClean = append(c.onClean, f)
	return true
}

// Wait waits until no drain is under way, or ctx ends.
func (c *Conn) Wait(ctx context.Context) error {
	c.mu.Lock()
	ch := c.cleaned
	draining := c.st == stateDraining
	c.mu.Unlock()
	if !draining {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the connection and breaks the Conn.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.breakLocked(net.ErrClosed)
	c.mu.Unlock()
	return c.Conn.Close()
}

// breakLocked makes the Conn unusable. Caller must hold c.mu.
func (c *Conn) breakLocked(err error) {
	if c.st == stateBroken {
		return
	}
	c.st, c.err = stateBroken, err
	c.cond.Broadcast()
}

// Write sends b, with the staged queries before it and the queued one after it when b starts or
// ends a request. It waits while a drain is under way.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	for c.st == stateDraining {
		c.cond.Wait()
	}
	switch c.st {
	case stateBroken:
		err := c.err
		c.mu.Unlock()
		return 0, err
	case stateStartup:
		c.mu.Unlock()
		return c.Conn.Write(b)
	}
	out := b
	if c.wrem == 0 && !c.extOpen && len(b) > 0 && startsRequest(b[0]) {
		c.wbuf = c.wbuf[:0]
		if c.staged != c.applied {
			sql := c.staged
			if sql == "" {
				sql = c.opts.ResetSQL
			}
			c.wbuf = appendQuery(c.wbuf, sql)
			c.reqs = append(c.reqs, request{swallow: true})
			c.applied = c.staged
		}
		c.scanLocked(b)
		if c.after != "" && c.wrem == 0 && !c.extOpen {
			c.wbuf = append(c.wbuf, b...)
			c.wbuf = appendQuery(c.wbuf, c.after)
			c.reqs = append(c.reqs, request{swallow: true})
			c.after = ""
		} else if len(c.wbuf) > 0 {
			c.wbuf = append(c.wbuf, b...)
		}
		if len(c.wbuf) > 0 {
			out = c.wbuf
		}
	} else {
		c.scanLocked(b)
	}
	c.writing = true
	c.mu.Unlock()

	n, err := c.Conn.Write(out)

	c.mu.Lock()
	c.writing = false
	if err != nil {
		// The server may have part of a message: nothing can be sent on this session again.
		c.breakLocked(err)
	}
	c.mu.Unlock()
	if len(out) != len(b) {
		// b went out inside a larger write; report it all or nothing.
		if err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return n, err
}

// startsRequest reports whether a frontend message of type t may begin a new request, so that
// staged queries may go before it. Copy data ('d', 'c', 'f') continues one.
func startsRequest(t byte) bool {
	switch t {
	case feQuery, feParse, feBind, feDescribe, feExecute, feClose, feSync, feFlush, feFuncCall:
		return true
	}
	return false
}

// scanLocked notes the requests that b sends. Caller must hold c.mu.
func (c *Conn) scanLocked(b []byte) {
	for len(b) > 0 {
		if c.wrem > 0 {
			k := min(c.wrem, len(b))
			c.wrem -= k
			b = b[k:]
			continue
		}
		typ, size, ok := header(b)
		if !ok {
			// A header split across writes: pgconn never does this; count it as a message of
			// unknown length, which ends tracking safely by breaking at the next interrupt.
			c.wrem = len(b)
			return
		}
		switch typ {
		case feQuery, feFuncCall:
			c.reqs = append(c.reqs, request{})
			c.cause = nil
		case feSync:
			c.reqs = append(c.reqs, request{mutates: c.extMutates})
			c.extOpen, c.extMutates = false, false
			c.cause = nil
		case feParse:
			c.extOpen = true
			if size > headerLen && len(b) > headerLen && namedParse(b[headerLen:min(size, len(b))]) {
				c.extMutates = true
			}
		case feClose:
			c.extOpen, c.extMutates = true, true
		case feBind, feDescribe, feExecute, feFlush:
			c.extOpen = true
		}
		k := min(size, len(b))
		c.wrem = size - k
		b = b[k:]
	}
}

// timeoutError is what a read woken by Interrupt with no request in flight returns, as a socket
// deadline would (pgconn then keeps the connection, as in WaitForNotification).
type timeoutError struct{}

func (timeoutError) Error() string   { return "wire: interrupted: " + os.ErrDeadlineExceeded.Error() }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
func (timeoutError) Unwrap() error   { return os.ErrDeadlineExceeded }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
