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
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Options configure a Conn.
type Options struct {
	// ResetSQL restores the session defaults after Stage("") (RESET of every setting Stage sets).
	// "" when the owner stages no settings (behind a transaction pooler): a SET of pgconn's is
	// then not tracked either.
	ResetSQL string
	// Grace bounds a drain: the server must answer the cancel and every request within it.
	Grace time.Duration
	// Settle is waited after an acknowledged cancel before the Conn is clean again. It is 0 for a
	// direct connection to PostgreSQL, which signals the backend before it acknowledges; a pooler
	// may acknowledge before it forwards the cancel.
	Settle time.Duration
	// ReplyWait is how long a drain waits for the reply of a cut request before it sends a
	// cancel request (0: 2 ms; negative: none). A statement of a millisecond, cut by a deadline
	// that ended as its connection was handed over, needs none: a cancel request costs the
	// server a process (PostgreSQL forks one for each), and the drain a round trip. There is no
	// wait inside a transaction block, nor for a cut COPY FROM STDIN.
	ReplyWait time.Duration
	// NoCancel turns cancel requests off (a pooler that cannot take them): a drain then waits for
	// the request to end by itself, within Grace.
	NoCancel bool
	// Ready says the connection is wrapped after authentication, between two requests (idle, not
	// in a transaction): tracking starts at once instead of at the first ReadyForQuery.
	Ready bool
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
	// staged: a query of the owner's (Stage, After), not pgconn's. Its replies are dropped; an
	// error in it means the session is not what the owner staged (Failed).
	staged bool
	// cut: a request of pgconn's that an interrupt ended early. pgconn was handed a synthetic end
	// of it; the server's replies are dropped, its notices and a FATAL excepted.
	cut bool
	// mutates: it closes named prepared statements (or creates one whose name wire did not see
	// whole), whose server state pgconn can no longer know if the request is ended early.
	mutates bool
	// parsed: the named prepared statements it creates; parseSeen the ParseCompletes of it
	// pgconn read, parseDone those read in all (the server answers its Parses in order, and
	// skips the rest after an error). If it is cut, the drain closes the statements the server
	// created whose ParseComplete pgconn never read (Conn.undo): pgx takes those as not created
	// (a Prepare that failed before its ParseComplete; pgconn's pipeline returned an error
	// before their descriptions). One whose ParseComplete pgconn read is its caller's to
	// handle: pgx deallocates it (Conn.Prepare's failedDescribeStatement, a batch's
	// invalidation), and a pipeline's caller may hold its description.
	parsed               []parseRef
	parseSeen, parseDone int
}

// parseRef is a named Parse of a request: ord is its place among the request's Parses.
type parseRef struct {
	ord  int
	name string
}

// swallow reports whether the request's replies are dropped.
func (q request) swallow() bool { return q.staged || q.cut }

// streamAbove is the size beyond which a message handed to pgconn is passed through as it
// arrives instead of being buffered whole; an interrupt in the middle of one breaks the Conn.
const streamAbove = 256 << 10

// errBroken is returned by the calls of a broken Conn.
var errBroken = errors.New("wire: connection unusable after an interrupted request")

// Conn is a net.Conn that tracks requests and replies. It is safe for concurrent Read and Write,
// as pgconn's background reader requires. It works over any net.Conn that carries the protocol in
// the clear, a *tls.Conn included: an interrupt sets only a read deadline unless a write is under
// way (a write deadline that fires breaks a TLS session for good).
type Conn struct {
	net.Conn
	// Born is the user's record of when the connection was made (pgxlanes: a reading of its
	// clock), set once before the Conn is shared; wire does not read it.
	Born int64
	// Epoch is the user's record of the period the connection was made in (pgxlanes: the count
	// of Resets when its dial began), set once before the Conn is shared; wire does not read it.
	Epoch uint32
	// ParkedFor is the user's record of how long the connection was idle before it went back
	// to its pool (pgxlanes: parked between leases), read and reset when the pool next hands it
	// out; wire does not read it.
	ParkedFor int64

	opts   Options
	cancel func(context.Context) error // sends a cancel request for this session; nil: none
	// sock is the socket under Conn, found at New (SocketOf), for wakeWriter to poll; nil when
	// Conn hides it.
	sock syscall.RawConn

	wmu sync.Mutex // serializes Write, held while a Write waits for a drain
	smu sync.Mutex // serializes the socket writes of Write and of a drain (CopyFail)

	mu   sync.Mutex // guards everything below, except rbuf, r and w (see below)
	cond *sync.Cond // broadcast when a drain ends, the Conn breaks, or an interrupt or output arrives
	st   state
	err  error // why the Conn broke

	reqs []request // sent requests without their ReadyForQuery, oldest first
	tx   byte      // transaction status of the last ReadyForQuery handed to pgconn
	srv  byte      // transaction status of the last ReadyForQuery read from the server
	// reqs0 is where reqs starts over once empty (popLocked): a request at a time never allocates.
	reqs0 [4]request

	staged string // settings to stage before the next request; == applied when none
	// applied: the session settings the server has once every staged query is sent;
	// unknownSettings once a request of pgconn's ran SET, RESET or DISCARD, so that the next
	// staged settings (the defaults included) are sent whatever they are.
	applied string
	after   string // a query to send right after the next request
	failed  bool   // a staged query failed: the session is not what the owner staged

	// The frontend stream's framing, across writes.
	wrem       int             // bytes left of the frontend message the last write ended in
	hdr        [headerLen]byte // the start of a message header split across writes
	nhdr       int             // bytes of it in hdr
	extOpen    bool            // extended-protocol messages were written since the last Sync
	extMutates bool            // and one closes a statement, or creates one with a torn name
	extCloses  bool            // and one of them closes a statement or portal
	extParsed  []parseRef      // and these are the named statements their Parses create
	extParses  int             // and this many Parses, named or not
	mutated    bool            // a drained or dropped request had mutates set
	undo       []string        // statements created by drained requests, for the drain to close

	// drop: pgconn's writes are dropped until it starts a new request: the rest of a request an
	// interrupt ended before it was sent (its synthetic end is in out), or the copy data of a cut
	// COPY FROM STDIN (the drain ends the COPY with a CopyFail of its own).
	drop    bool
	copyIn  bool // pgconn was handed a CopyInResponse and has not ended the copy
	copyEnd bool // pgconn ended the copy of the current request (CopyDone or CopyFail) on the socket
	copyCut bool // the drain must send CopyFail: the server waits for the data of a cut COPY
	fatal   bool // out holds a FATAL: writes are dropped so that pgconn reads it
	wwait   int  // Writes waiting for a drain to end

	// rbuf[r:w] are bytes read from the server and not yet handed on (the stash, see read.go).
	// rbuf is nil, and r and w 0, whenever it is empty: an idle connection holds no buffer of
	// its own. rbp is rbuf's buffer, from getStash, given back by releaseLocked. They are
	// touched by the reader while it holds mu or while it alone reads (reading), and by a drain
	// while the Conn is draining, when no reader touches them.
	rbuf    []byte
	rbp     *[]byte
	r, w    int
	cur     int    // bytes of a message being handed to pgconn that it has not had yet
	out     []byte // bytes to hand to pgconn before any other: a synthetic end, stashed messages
	reading bool   // a reader is in a socket read without mu
	writing bool   // a writer is in a socket write
	wseq    uint32 // counts the socket writes of Write, so that a late wakeWriter knows its write
	wdead   bool   // wakeWriter set a write deadline on the write under way
	warmed  bool   // a wakeWriter is set for the write under way (armWakeLocked)

	intr    error         // a pending interrupt's cause
	cause   error         // cause of the last early end, until the next request
	cleaned chan struct{} // closed when the current drain ends
	onClean []Cleaner
}

// New wraps c, which carries the protocol in the clear (a TCP or Unix socket, or a *tls.Conn).
// Until the first ReadyForQuery (the end of authentication) bytes pass through untouched, and an
// interrupt only sets a deadline of now, as pgconn's DeadlineContextWatcherHandler does; so c may
// be wrapped before the startup message, or after authentication with Options.Ready.
func New(c net.Conn, opts Options) *Conn {
	w := &Conn{Conn: c, opts: opts, sock: SocketOf(c)}
	w.cond = sync.NewCond(&w.mu)
	w.reqs = w.reqs0[:0]
	if opts.Ready {
		w.st, w.tx, w.srv = stateReady, 'I', 'I'
	}
	return w
}

// SetCancel sets the function that sends a cancel request for this session (pgconn's
// CancelRequest). It must be set before the first request.
func (c *Conn) SetCancel(f func(context.Context) error) {
	c.mu.Lock()
	c.cancel = f
	c.mu.Unlock()
}

// unknownSettings is applied once the session's settings are not known: it equals no target.
const unknownSettings = "\x00unknown"

// settingsChangedLocked records that a request of pgconn's changed the session's settings: the
// next settings staged, the defaults included, are sent whatever they are. Until then nothing is
// sent: the session keeps what the request set (a SET in AfterConnect is what the pool reads as
// the user's values). Caller must hold c.mu.
func (c *Conn) settingsChangedLocked() {
	if c.opts.ResetSQL == "" {
		return
	}
	if c.staged == c.applied {
		c.staged = unknownSettings
	}
	c.applied = unknownSettings
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
// settings its owner staged. One that fails during a drain also breaks the Conn.
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

// Draining reports whether the replies of a request ended early are still being dropped.
func (c *Conn) Draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st == stateDraining
}

// Cleaner is told, on the drain's goroutine, that the drain it waited for ended; ok is false if
// the Conn broke. An interface rather than a func, so that a caller can pass itself without
// allocating a closure on every release.
type Cleaner interface {
	Cleaned(ok bool)
}

// OnClean arranges for f.Cleaned to be called, on the drain's goroutine, when the current drain
// ends. It returns false, and does not call f, if no drain is under way.
func (c *Conn) OnClean(f Cleaner) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != stateDraining {
		return false
	}
	c.onClean = append(c.onClean, f)
	return true
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
// ends a request. While a drain is under way, a write that starts a request waits for it to end;
// if the caller's context ends meanwhile (Interrupt), the request is not sent at all: pgconn is
// handed a synthetic end of it, as for a request cut in flight, and the rest of it is dropped.
// The rest of a cut COPY's data is dropped at once, without waiting. An interrupt during the
// socket write is left to the reader once the write ends; a write still under way writeStall
// after it is ended by a deadline, which breaks the Conn.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if c.st == stateStartup {
		c.mu.Unlock()
		return c.Conn.Write(b)
	}
	if c.drop && !c.atRequestLocked(b) {
		c.dropLocked(b)
		c.mu.Unlock()
		return len(b), nil
	}
	c.drop = false
	for c.st == stateDraining {
		if c.intr != nil {
			if !c.atRequestLocked(b) {
				// pgconn is in the middle of a request whose start was sent: it cannot be
				// ended here without the server seeing half of it.
				c.breakLocked(fmt.Errorf("%w: interrupted in the middle of a request", errBroken))
				break
			}
			c.cause, c.intr = c.intr, nil
			c.drop = true
			c.dropLocked(b)
			c.mu.Unlock()
			return len(b), nil
		}
		c.wwait++
		c.cond.Wait()
		c.wwait--
	}
	if c.st == stateBroken {
		if c.fatal {
			// pgconn is to read the server's FATAL, as it would without this package.
			c.mu.Unlock()
			return len(b), nil
		}
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	out := b
	var wb *[]byte // a pooled buffer for a write with staged queries around b
	if c.atRequestLocked(b) {
		var buf []byte
		if c.staged != c.applied {
			sql := c.staged
			if sql == "" {
				sql = c.opts.ResetSQL
			}
			wb = writePool.Get().(*[]byte)
			buf = appendQuery((*wb)[:0], sql)
			c.reqs = append(c.reqs, request{staged: true})
			c.applied = c.staged
		}
		c.scanLocked(b, true)
		if c.after != "" && c.wrem == 0 && c.nhdr == 0 && !c.extOpen {
			if wb == nil {
				wb = writePool.Get().(*[]byte)
				buf = (*wb)[:0]
			}
			buf = append(buf, b...)
			buf = appendQuery(buf, c.after)
			c.reqs = append(c.reqs, request{staged: true})
			c.after = ""
		} else if wb != nil {
			buf = append(buf, b...)
		}
		if wb != nil {
			out, *wb = buf, buf
		}
	} else {
		c.scanLocked(b, true)
	}
	c.writing = true
	c.wseq++
	c.warmed = false
	if c.intr != nil {
		// An interrupt came before the write: as for one during it (Interrupt).
		c.armWakeLocked()
	}
	c.mu.Unlock()

	c.smu.Lock()
	n, err := c.Conn.Write(out)
	c.mu.Lock()
	c.writing = false
	if c.wdead {
		// wakeWriter's deadline, cleared before a drain's CopyFail (under smu) sets its own.
		c.wdead = false
		if err == nil {
			_ = c.Conn.SetWriteDeadline(time.Time{})
		}
	}
	c.smu.Unlock()
	switch {
	case err != nil:
		// The server may have part of a message (and a write that sent nothing may have left
		// a TLS session unusable): nothing can be sent on this session again.
		c.breakLocked(err)
	case c.intr != nil && c.reading:
		// An interrupt came during the write and left the reader to it (Interrupt).
		_ = c.Conn.SetReadDeadline(time.Now())
	}
	c.mu.Unlock()
	if wb != nil && cap(*wb) <= maxPooledWrite {
		writePool.Put(wb)
	}
	if len(out) != len(b) {
		// b went out inside a larger write; report it all or nothing.
		if err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return n, err
}

// writePool holds the buffers of writes with staged queries around the application's bytes,
// shared by every Conn, so that an idle Conn holds none.
var writePool = sync.Pool{New: func() any {
	b := make([]byte, 0, 512)
	return &b
}}

// maxPooledWrite is the capacity above which a write's buffer is left to the collector.
const maxPooledWrite = 64 << 10

// atRequestLocked reports whether b starts a new request at a message boundary. Caller must hold
// c.mu.
func (c *Conn) atRequestLocked(b []byte) bool {
	return c.wrem == 0 && c.nhdr == 0 && !c.extOpen && len(b) > 0 && startsRequest(b[0])
}

// dropLocked drops b, which pgconn believes it sent, and queues for pgconn a synthetic end of
// each request b ends. Caller must hold c.mu.
func (c *Conn) dropLocked(b []byte) {
	c.scanLocked(b, false)
	c.cond.Broadcast() // a reader waiting during a drain has output now
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

// scanLocked notes the requests that b sends (sent), or queues a synthetic end of each request
// it ends (a dropped b). A header split across writes is kept in hdr until it is whole. Caller
// must hold c.mu.
func (c *Conn) scanLocked(b []byte, sent bool) {
	for len(b) > 0 {
		if c.wrem > 0 {
			k := min(c.wrem, len(b))
			c.wrem -= k
			b = b[k:]
			continue
		}
		if c.nhdr > 0 || len(b) < headerLen {
			k := copy(c.hdr[c.nhdr:], b)
			c.nhdr += k
			b = b[k:]
			if c.nhdr < headerLen {
				return
			}
			c.nhdr = 0
			typ, size, _ := header(c.hdr[:])
			if size < headerLen {
				c.wrem = 0
				continue // malformed: the server will say so
			}
			body := b[:min(size-headerLen, len(b))]
			c.noteLocked(typ, size, body, sent)
			c.wrem = size - headerLen
			continue
		}
		typ, size, _ := header(b)
		if size < headerLen {
			size = headerLen // malformed: the server will say so
		}
		c.noteLocked(typ, size, b[headerLen:min(size, len(b))], sent)
		k := min(size, len(b))
		c.wrem = size - k
		b = b[k:]
	}
}

// noteLocked notes one frontend message of type typ and total size size, of whose body the
// first bytes are body. Caller must hold c.mu.
func (c *Conn) noteLocked(typ byte, size int, body []byte, sent bool) {
	switch typ {
	case feQuery, feFuncCall:
		c.endRequestLocked(request{}, sent, false)
		if sent {
			c.copyEnd = false
		}
	case feSync:
		// A dropped request that closes a statement is one pgx may believe done; one that only
		// prepares failed for pgx as for the server, which never saw it.
		c.endRequestLocked(request{mutates: c.extMutates, parsed: c.extParsed}, sent, c.extCloses)
		c.extOpen, c.extMutates, c.extCloses, c.extParsed, c.extParses = false, false, false, nil, 0
	case feParse:
		c.extOpen = true
		ord := c.extParses
		c.extParses++
		// A name not in this write is taken to be there: pgconn never splits a header.
		if size > headerLen && (len(body) == 0 || namedParse(body)) {
			if name, ok := parseName(body); ok {
				c.extParsed = append(c.extParsed, parseRef{ord: ord, name: name})
			} else {
				c.extMutates = true
			}
		}
	case feClose:
		// A cut Close breaks the Conn: pgx may believe the statement is still there, and
		// pgconn's Deallocate returns at the synthetic ErrorResponse, leaving its
		// ReadyForQuery unread for the next call to take as its own.
		c.extOpen, c.extMutates, c.extCloses = true, true, true
	case feBind, feDescribe, feExecute, feFlush:
		c.extOpen = true
	case feCopyDone, feCopyFail:
		c.copyIn = false
		if sent {
			c.copyEnd = true
		}
	}
}

// endRequestLocked notes the end of a request: sent, it is tracked; dropped, pgconn gets a
// synthetic end of it at once. Caller must hold c.mu.
func (c *Conn) endRequestLocked(q request, sent, closes bool) {
	if sent {
		c.reqs = append(c.reqs, q)
		c.cause = nil
		return
	}
	c.out = appendError(c.out, cancelCode, cancelMessage)
	c.out = appendReady(c.out, c.tx)
	if closes {
		// pgx may believe it closed a statement that the server still has.
		if c.st == stateDraining {
			c.mutated = true
		} else {
			c.breakLocked(fmt.Errorf("%w: it closed a named prepared statement", errBroken))
		}
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
