package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
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
// soon as it is sent, until ClearInterrupt. During a drain, a write waiting for it to end is ended
// at once instead (its request is never sent), and so is a read waiting with nothing in flight.
// Interrupt does no network I/O and does not wait.
func (c *Conn) Interrupt(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.st {
	case stateDraining:
		c.intr = cause
		c.cond.Broadcast()
		return
	case stateStartup:
		// Nothing is tracked yet: end the call as a socket deadline would.
		c.intr = cause
		_ = c.Conn.SetDeadline(time.Now())
		return
	case stateReady:
	default:
		return
	}
	c.intr = cause
	switch {
	case c.writing:
		// A write under way almost always ends within microseconds, and the reader then takes
		// the interrupt (Write wakes it). A deadline ends a write for good (the server may hold
		// part of a message; a TLS session is unusable after any write error), even one about
		// to send its first byte: so it is set only on a write still under way after
		// writeStall whose socket's send buffer is nearly full, one the server does not take
		// (its receive window is full); see wakeWriter. Such a write breaks the Conn.
		c.armWakeLocked()
	case c.reading:
		// Wake the reader, which consumes the interrupt. Only the read side: a write deadline
		// that fires would break a TLS session.
		_ = c.Conn.SetReadDeadline(time.Now())
	case c.inFlightLocked() > 0:
		// pgconn is between its write and its read: end its request now. Only a request of
		// pgconn's counts: with only the replies of staged queries unread (After's, behind the
		// reply pgconn had), the interrupt waits for the next request, as with none.
		_ = c.consumeLocked()
	}
}

// writeStall is how long an interrupted write may go on before wakeWriter looks at it.
const writeStall = 10 * time.Millisecond

// maxWriteLooks is how many times wakeWriter looks at a write under way whose send buffer has
// room before it ends it anyway: about a second of the process running (a frozen process runs
// no timer either).
const maxWriteLooks = 100

// armWakeLocked arranges for the socket write under way to be looked at by wakeWriter if it is
// still under way after writeStall. Caller must hold c.mu.
func (c *Conn) armWakeLocked() {
	if c.warmed {
		return
	}
	c.warmed = true
	seq := c.wseq
	time.AfterFunc(writeStall, func() { c.wakeWriter(seq, 1) })
}

// wakeWriter ends the socket write seq with a write deadline if it is still under way and the
// server does not take it: the write then breaks the Conn (pgconn closes it). The deadline stays
// until the write returns (consumeLocked, ClearInterrupt and writeCopyFail leave it), so the
// write cannot miss it.
//
// A write whose socket's send buffer has room (poll's POLLOUT: on Linux, about a third of the
// buffer free) is not held up by the server: its goroutine has not run since wire noted the write
// (a loaded machine, a CPU quota), or the buffer drained as it waited. A deadline would end it,
// in the window before its system call with nothing sent, and lose the session; so wakeWriter
// looks again writeStall later, up to maxWriteLooks times. Where wire cannot see the socket (a
// wrapper that hides it, or a platform without poll), or the buffer is nearly full (the server
// does not read, or a larger write before this one still fills it), a write still under way is
// taken as stalled. The poll is made without c.mu: nothing waits on it.
func (c *Conn) wakeWriter(seq uint32, looks int) {
	if looks < maxWriteLooks && c.sock != nil {
		c.mu.Lock()
		live := c.writing && c.wseq == seq && !c.wdead
		c.mu.Unlock()
		if !live {
			return
		}
		if pollWritable(c.sock) {
			time.AfterFunc(writeStall, func() { c.wakeWriter(seq, looks+1) })
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.writing || c.wseq != seq || c.wdead {
		return
	}
	c.wdead = true
	_ = c.Conn.SetWriteDeadline(time.Now())
}

// SocketOf returns the socket under c, looking through wrappers that expose what they wrap
// (NetConn, as *tls.Conn does), or nil if c hides it. New asks once: a wrapper that changes its
// socket later, or shows it only later, is looked at through the one New found, or taken as
// hiding it.
func SocketOf(c net.Conn) syscall.RawConn {
	for range 8 {
		switch x := c.(type) {
		case syscall.Conn:
			rc, err := x.SyscallConn()
			if err != nil {
				return nil
			}
			return rc
		case interface{ NetConn() net.Conn }:
			if c = x.NetConn(); c == nil {
				return nil
			}
		default:
			return nil
		}
	}
	return nil
}

// ClearInterrupt drops an interrupt that no request consumed.
func (c *Conn) ClearInterrupt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.intr == nil {
		return
	}
	c.intr = nil
	if c.st == stateReady || c.st == stateStartup { // a drain owns the read deadline
		c.clearDeadlinesLocked()
	}
}

// clearDeadlinesLocked clears the socket's deadlines, but for the write deadline wakeWriter may
// have set on the write under way, which must end that write: while a write is under way, only a
// deadline of wakeWriter's can be the write deadline (a drain's CopyFail writes while draining),
// so only the read deadline is cleared. Caller must hold c.mu.
func (c *Conn) clearDeadlinesLocked() {
	if c.writing {
		_ = c.Conn.SetReadDeadline(time.Time{})
	} else {
		_ = c.Conn.SetDeadline(time.Time{})
	}
}

// consumeLocked acts on a pending interrupt: with a request of pgconn's in flight, it queues a
// synthetic end of it for pgconn and starts a drain; with none, it returns a timeout for the
// reader, as a socket deadline would. It breaks the Conn, and returns a timeout for pgconn, which
// then closes the connection, when pgconn is in the middle of a message whose rest has not
// arrived, or when several of its requests are in flight (a pipeline with several Syncs: pgconn
// closes the connection on a timeout, and its error is then one for which pgconn.Timeout(err) and
// errors.Is(err, ctx.Err()) hold, which a synthetic 57014 cannot give the raw pipeline API).
// Caller must hold c.mu.
func (c *Conn) consumeLocked() error {
	cause := c.intr
	c.intr = nil
	c.clearDeadlinesLocked()
	owned := c.inFlightLocked()
	if owned == 0 {
		return timeoutError{}
	}
	if c.cur > c.w-c.r || owned > 1 {
		c.breakLocked(timeoutError{})
		return timeoutError{}
	}
	// After what out still holds for pgconn (messages a drain kept, when Interrupt consumes the
	// interrupt before pgconn's first Read; a message whose start Read handed out already), the
	// rest of a message pgconn has begun from the stash, then an error and a ReadyForQuery. out
	// holds whole messages and Read empties it before it hands out the stash, so the synthetic
	// end never follows part of a message.
	c.out = append(c.out, c.rbuf[c.r:c.r+c.cur]...)
	c.r += c.cur
	c.cur = 0
	c.out = appendError(c.out, cancelCode, cancelMessage)
	tx := c.tx
	if tx != 'I' {
		tx = 'E' // a statement that fails inside a transaction block aborts it
	}
	c.out = appendReady(c.out, tx)
	for i := range c.reqs {
		if !c.reqs[i].staged {
			c.reqs[i].cut = true
		}
	}
	// A COPY FROM STDIN whose CopyInResponse pgconn had: the server waits for its data, and acts
	// on a cancel only when some arrives, so the drain ends it with a CopyFail. pgconn's own copy
	// data and CopyDone are dropped from now on.
	c.copyCut = c.copyIn && !c.copyEnd
	c.copyIn = false
	c.drop = true
	c.tx = tx
	c.cause = cause
	c.st = stateDraining
	c.cleaned = make(chan struct{})
	c.reserveLocked(1) // the drain reads into the stash
	boundary := c.wrem == 0 && c.nhdr == 0
	go c.drain(time.Now().Add(c.opts.Grace), tx, boundary)
	return nil
}

// replyWait is how long the drain of a request cut in transaction status told waits for its
// reply before the first cancel request: Options.ReplyWait, but none inside a transaction block
// (pgconn was told it is aborted, 'E': a statement that ends by itself meanwhile leaves it 'T', and
// the Conn would break), and none for a cut COPY FROM STDIN whose server waits for data (the
// CopyFail comes first).
func (c *Conn) replyWait(told byte) time.Duration {
	c.mu.Lock()
	copyCut := c.copyCut
	c.mu.Unlock()
	switch {
	case told != 'I', copyCut, c.opts.ReplyWait < 0:
		return 0
	case c.opts.ReplyWait == 0:
		return defaultReplyWait
	}
	return c.opts.ReplyWait
}

// defaultReplyWait is Options.ReplyWait's default.
const defaultReplyWait = 2 * time.Millisecond

// copyFailMessage is the reason a drain gives the server when it ends a cut COPY.
const copyFailMessage = "pgxlanes: the caller's context ended"

// drain reads and drops the replies of the requests an interrupt ended, after a cancel request,
// then makes the Conn ready again, or breaks it when the session may not be what pgconn believes.
// It runs on its own goroutine; while the Conn is draining nothing else touches rbuf or reads the
// socket. boundary says whether the frontend stream was at a message boundary when the drain
// began, so that it may write a CopyFail.
//
// A cancel that reaches the backend before it starts the statement (while it still reads the
// request) is ignored by the server, so the cancel is sent again while replies are outstanding,
// at growing intervals. That is safe: nothing new is sent on the session until the drain ends,
// and each cancel is acknowledged (the backend signalled) before the next read.
func (c *Conn) drain(deadline time.Time, told byte, boundary bool) {
	ok, err := c.skip() // what is already buffered may end it all
	if wait := c.replyWait(told); !ok && err == nil && wait > 0 {
		// A request cut a moment before its reply needs no cancel request (Options.ReplyWait).
		until := time.Now().Add(wait)
		if deadline.Before(until) {
			until = deadline
		}
		ok, err = c.read(until)
		if err != nil && isTimeout(err) && time.Now().Before(deadline) {
			err = nil
		}
	}
	acked := true
	copyFailed := false
	for wait := 20 * time.Millisecond; !ok && err == nil; wait = min(2*wait, 250*time.Millisecond) {
		if c.takeCopyCut() && !copyFailed {
			copyFailed = true
			if !boundary {
				err = errors.New("a COPY was cut in the middle of a message")
				break
			}
			if err = c.writeCopyFail(deadline); err != nil {
				break
			}
		}
		if !c.opts.NoCancel && c.cancel != nil {
			acked = c.sendCancel(deadline)
			if !acked {
				break
			}
		}
		// Without cancel requests too, the reads are in steps: a CopyInResponse that arrives
		// meanwhile gets its CopyFail at the next.
		until := deadline
		if t := time.Now().Add(wait); t.Before(deadline) {
			until = t
		}
		ok, err = c.read(until)
		if err != nil && isTimeout(err) && time.Now().Before(deadline) {
			err = nil // not answered yet: cancel again
		}
	}
	// The named statements the cut requests created without pgconn knowing (their
	// ParseComplete read by the drain only): pgx takes them as not created, and would fail to
	// prepare them again under the same name (42P05). They are closed, so that the session has
	// what pgx believes. A Parse the server refused (its name taken: a statement pgx may know)
	// gets no Close, nor one whose ParseComplete pgconn read (request.parsed).
	if undo := c.takeUndo(); ok && err == nil && acked && len(undo) > 0 {
		ok, err = c.closeStatements(deadline, undo)
	}

	c.mu.Lock()
	mutated := c.mutatedLocked()
	clean := c.st == stateDraining && ok && err == nil && acked && c.srv == told && !mutated && !c.failed && !c.fatal
	if clean {
		c.st = stateReady
		c.cond.Broadcast()
	} else {
		switch {
		case c.st == stateBroken:
		case c.fatal:
			err = fmt.Errorf("%w: the server ended the session", errBroken)
		case err != nil:
			err = fmt.Errorf("%w: reading the server's replies: %w", errBroken, err)
		case !acked:
			err = fmt.Errorf("%w: the server did not acknowledge the cancel request", errBroken)
		case mutated:
			err = fmt.Errorf("%w: it closed a named prepared statement", errBroken)
		case c.failed:
			err = fmt.Errorf("%w: a staged session setting failed", errBroken)
		default:
			err = fmt.Errorf("%w: transaction status %q, pgconn was told %q", errBroken, c.srv, told)
		}
		c.breakLocked(err)
	}
	c.releaseLocked()
	close(c.cleaned)
	fs := c.onClean
	c.onClean = nil
	c.mu.Unlock()
	for _, f := range fs {
		f.Cleaned(clean)
	}
}

// takeUndo returns the statements to close, and forgets them.
func (c *Conn) takeUndo() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	undo := c.undo
	c.undo = nil
	return undo
}

// closeStatements closes the named statements, as a request of wire's own whose replies the
// drain drops (an error in it means the session is not what pgx believes), and reads until it
// is answered.
func (c *Conn) closeStatements(deadline time.Time, names []string) (bool, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, request{staged: true})
	c.mu.Unlock()
	if err := c.writeOwn(deadline, appendCloseStatements(nil, names)); err != nil {
		return false, err
	}
	return c.read(deadline)
}

// takeCopyCut reports whether the server waits for the data of a cut COPY.
func (c *Conn) takeCopyCut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cut := c.copyCut
	c.copyCut = false
	return cut
}

// writeCopyFail ends a cut COPY FROM STDIN: the server answers with an error and a ReadyForQuery.
func (c *Conn) writeCopyFail(deadline time.Time) error {
	return c.writeOwn(deadline, appendCopyFail(nil, copyFailMessage))
}

// writeOwn writes messages of the drain's own, by the deadline.
func (c *Conn) writeOwn(deadline time.Time, msg []byte) error {
	c.smu.Lock()
	defer c.smu.Unlock()
	_ = c.Conn.SetWriteDeadline(deadline)
	_, err := c.Conn.Write(msg)
	c.mu.Lock()
	if c.wdead {
		// A Write waiting for smu was found stalled meanwhile (wakeWriter): its deadline must
		// stay until it returns.
		_ = c.Conn.SetWriteDeadline(time.Now())
	} else {
		_ = c.Conn.SetWriteDeadline(time.Time{})
	}
	c.mu.Unlock()
	return err
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
		if ok, serr := c.skip(); ok || serr != nil {
			return ok, serr
		}
		if err != nil {
			return false, err
		}
	}
}

// skip drops the whole messages in rbuf that belong to the requests being drained and reports
// whether every request has been answered. What pgconn must still see is kept for it, in out:
// notifications and parameter changes, the notices of its own cut requests, and a FATAL error
// (then the session ends, and pgconn reads the server's reason instead of an EOF). The error of a
// staged query marks the session failed. A message that may be kept (keepable) is read whole, the
// stash grown for it up to streamAbove; one larger than that breaks the Conn, rather than be
// dropped unseen. Any other message larger than rbuf is dropped as it arrives. skip returns the
// Conn's error once it broke.
func (c *Conn) skip() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.out)
	defer func() {
		if len(c.out) != n {
			c.cond.Broadcast() // a reader may wait for it
		}
	}()
	for len(c.reqs) > 0 {
		if c.cur > 0 { // the rest of a large message being dropped
			k := min(c.cur, c.w-c.r)
			c.r, c.cur = c.r+k, c.cur-k
			if c.cur > 0 {
				return false, nil
			}
			continue
		}
		typ, size, ok := header(c.rbuf[c.r:c.w])
		if !ok {
			return false, nil
		}
		if size < headerLen {
			c.breakLocked(fmt.Errorf("%w: a malformed message from the server", errBroken))
			return false, c.err
		}
		q := c.reqs[0]
		if c.w-c.r < size {
			switch {
			case keepable(typ, q):
				if size > streamAbove {
					c.breakLocked(fmt.Errorf("%w: a message of type %q of %d bytes arrived during a drain, larger than the %d bytes kept for pgconn", errBroken, typ, size, streamAbove))
					return false, c.err
				}
				c.reserveLocked(size) // read it whole
				return false, nil
			case size <= len(c.rbuf):
				return false, nil
			}
			c.cur = size
			continue
		}
		msg := c.rbuf[c.r : c.r+size]
		body := msg[headerLen:]
		switch typ {
		case beNotification, beParamStatus:
			c.out = append(c.out, msg...)
		case beNotice:
			if !q.staged {
				c.out = append(c.out, msg...)
			}
		case beError:
			switch {
			case fatal(body):
				c.out = append(c.out, msg...)
				c.fatal = true
			case q.staged:
				c.failed = true
			}
		case beComplete:
			if !q.staged && changesSettings(body) {
				c.settingsChangedLocked()
			}
		case beParseDone:
			c.parseDoneLocked()
		case beCopyIn:
			if q.cut && !c.copyEnd {
				c.copyCut = true
			}
		case beReady:
			if len(body) == 1 {
				c.srv = body[0]
			}
			if q.mutates {
				c.mutated = true
			}
			if q = c.reqs[0]; q.cut {
				for _, p := range q.parsed {
					if p.ord >= q.parseSeen && p.ord < q.parseDone { // created; pgconn never knew
						c.undo = append(c.undo, p.name)
					}
				}
			}
			c.popLocked()
		}
		c.r += size
	}
	return true, nil
}

// keepable reports whether skip may keep a message of type typ for pgconn, or must read its body
// to know: an ErrorResponse may be a FATAL, or the failure of a staged query.
func keepable(typ byte, q request) bool {
	switch typ {
	case beNotification, beParamStatus, beError:
		return true
	case beNotice:
		return !q.staged
	}
	return false
}

// mutatedLocked reports whether a drained request closed named prepared statements (or created
// one whose name wire did not see whole). Caller must hold c.mu.
func (c *Conn) mutatedLocked() bool {
	m := c.mutated
	c.mutated = false
	return m
}
