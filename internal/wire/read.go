package wire

import (
	"fmt"
	"math/bits"
	"sync"
	"time"
)

// The read path. pgconn reads the server's bytes into a buffer of its own (pgproto3's chunk
// reader, 8 KiB, grown for a larger message) and hands Read a slice of it, p. Read reads the
// socket straight into p and frames what arrived there, in place: a message of pgconn's stays
// where it is, the reply of a staged query is cut out of p (the bytes after it move up), and the
// bytes of a message that arrived only in part, at the end of p, are kept back: moved into the
// stash (rbuf), and at the next Read put at the start of p before the socket is read again. So
// pgconn only ever holds whole messages, as when the whole stream went through a buffer of
// wire's own, yet no byte is copied twice but those of a message cut by a read's end.
//
// The stash is a pooled buffer (pooled by size), held only while it holds bytes. It is used for what cannot go
// straight into p: a message larger than p (up to streamAbove; pgconn gets its first bytes once
// it is whole, so that an interrupt never finds pgconn in the middle of a message it must
// finish), whatever a read brings in once an interrupt is pending, and the drain's reads. A
// message larger than streamAbove is handed on as it arrives, as before.

// stashSize is the size of the smallest stash buffer.
const stashSize = 8192

// stashPools[i] holds stash buffers of stashSize<<i bytes, shared by every Conn; a buffer for a
// message over streamAbove is allocated and left to the collector.
var stashPools [7]sync.Pool

// stashClass returns the index in stashPools of the smallest buffer of n bytes or more.
func stashClass(n int) int { return bits.Len(uint(max(n, 1)-1) / stashSize) }

// getStash returns a buffer of n bytes or more.
func getStash(n int) *[]byte {
	i := stashClass(n)
	if i >= len(stashPools) {
		b := make([]byte, n)
		return &b
	}
	if b, ok := stashPools[i].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, stashSize<<i)
	return &b
}

// putStash gives back a buffer of getStash's.
func putStash(b *[]byte) {
	if i := stashClass(len(*b)); i < len(stashPools) && len(*b) == stashSize<<i {
		stashPools[i].Put(b)
	}
}

// Read hands pgconn the server's bytes, without the replies of staged queries, and a synthetic
// end of a request that an interrupt ended.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if len(c.out) > 0 {
			n := copy(p, c.out)
			c.out = c.out[n:]
			if len(c.out) == 0 {
				c.out = nil // an idle connection keeps no buffer
			}
			return n, nil
		}
		switch c.st {
		case stateBroken:
			return 0, c.err
		case stateDraining:
			if c.intr != nil && c.wwait == 0 {
				// Nothing of pgconn's is in flight (its requests were handed their synthetic
				// end): a read waiting here, as WaitForNotification's, times out.
				c.intr = nil
				return 0, timeoutError{}
			}
			c.cond.Wait()
			continue
		}
		if c.intr != nil {
			if c.cur == 0 || c.inFlightLocked() > 0 {
				if err := c.consumeLocked(); err != nil {
					return 0, err
				}
				continue
			}
			// The read deadline that woke this reader must not end the wait for the rest.
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
		// Without a request of pgconn's in flight, the message pgconn has begun is finished
		// before an interrupt returns a timeout: pgconn never sees a torn message.
		if n := c.deliverLocked(p); n > 0 {
			return n, nil
		}
		if c.st == stateBroken {
			continue // a malformed message in the stash
		}
		var err error
		if c.intr == nil && c.directLocked(len(p)) {
			var n int
			if n, err = c.readDirectLocked(p); n > 0 {
				return n, nil
			}
		} else {
			err = c.fillLocked()
		}
		if err != nil {
			if c.intr != nil && isTimeout(err) {
				continue // woken by Interrupt: consume it
			}
			if !isTimeout(err) {
				c.breakLocked(err)
			}
			return 0, err
		}
	}
}

// directLocked reports whether the next socket read may go straight into a buffer of n bytes:
// the stash holds at most the start of one message, which fits in it. Caller must hold c.mu.
func (c *Conn) directLocked(n int) bool {
	held := c.w - c.r
	if held == 0 {
		return true
	}
	if c.cur > 0 {
		return false
	}
	_, size, ok := header(c.rbuf[c.r:c.w])
	if !ok {
		return n > held
	}
	return size <= n
}

// readDirectLocked reads from the socket into p, after the stash's bytes (the start of a
// message), and frames what p then holds. It returns how many bytes at the start of p are
// pgconn's. It releases c.mu during the read. Caller must hold c.mu.
func (c *Conn) readDirectLocked(p []byte) (int, error) {
	k := copy(p, c.rbuf[c.r:c.w])
	c.r = c.w
	c.releaseLocked()
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(p[k:])
	c.mu.Lock()
	c.reading = false
	n += k
	if c.st == stateBroken || c.intr != nil && (err == nil || isTimeout(err)) {
		// An interrupt (or Close) came during the read: what arrived goes to the stash and
		// the loop in Read takes it from there. Not when the bytes came with the end of the
		// stream (a *tls.Conn returns the server's last bytes with io.EOF): no drain can
		// follow, and Read would return the error and lose them, a FATAL's reason with them;
		// pgconn gets them as if the interrupt came after the read.
		c.stashLocked(p[:n])
		return 0, err
	}
	return c.frameLocked(p[:n]), err
}

// frameLocked frames b, bytes just read from the server: it keeps pgconn's messages at the start
// of b, drops the replies of swallowed requests, moves the bytes of a message cut by b's end to
// the stash, and returns how many bytes at the start of b are pgconn's. Caller must hold c.mu.
func (c *Conn) frameLocked(b []byte) int {
	i, o := 0, 0 // b[i:] is still to frame; b[:o] is pgconn's
	if c.cur > 0 {
		// The rest of a message over streamAbove, handed on as it arrives.
		k := min(c.cur, len(b))
		c.cur -= k
		i, o = k, k
	}
	for i < len(b) {
		typ, size, ok := header(b[i:])
		if !ok {
			break
		}
		if typ == beDataRow && o == i && size >= headerLen && size <= len(b)-i && c.rowsOwnedLocked() {
			// The bulk of most replies: a whole row of a reply that is pgconn's, with nothing
			// dropped before it, stays where it is (as ownedLocked and the copy below would
			// leave it).
			i += size
			o = i
			continue
		}
		if !c.sizeOKLocked(typ, size) {
			return o
		}
		if len(b)-i < size {
			if size <= streamAbove || !c.ownedLocked(typ, nil) {
				break // kept back until it is whole
			}
			c.cur = size - (len(b) - i)
			o += copy(b[o:], b[i:])
			i = len(b)
			break
		}
		body := b[i+headerLen : i+size]
		if c.ownedLocked(typ, body) {
			if typ == beReady && len(body) == 1 {
				c.tx = body[0]
			}
			if o != i {
				copy(b[o:], b[i:i+size])
			}
			o += size
		}
		i += size
	}
	if i < len(b) {
		if _, size, ok := header(b[i:]); ok {
			c.reserveLocked(min(size, streamAbove)) // room for all of it: copied once
		}
		c.stashLocked(b[i:])
	}
	return o
}

// sizeOKLocked breaks the Conn and returns false if size cannot be that of a message of type typ.
// Caller must hold c.mu.
func (c *Conn) sizeOKLocked(typ byte, size int) bool {
	if size >= headerLen && (typ != beReady || size == headerLen+1) {
		return true
	}
	c.breakLocked(fmt.Errorf("%w: a malformed message from the server", errBroken))
	return false
}

// stashLocked appends b to the stash. Caller must hold c.mu.
func (c *Conn) stashLocked(b []byte) {
	if len(b) == 0 {
		return
	}
	c.reserveLocked(c.w - c.r + len(b))
	c.w += copy(c.rbuf[c.w:], b)
}

// reserveLocked makes room in the stash for n bytes from c.r on, and for one more byte than it
// holds. Caller must hold c.mu.
func (c *Conn) reserveLocked(n int) {
	n = max(n, c.w-c.r+1)
	switch {
	case c.rbuf == nil:
		c.r, c.w = 0, 0
		c.rbp = getStash(n)
		c.rbuf = *c.rbp
	case len(c.rbuf)-c.r >= n:
	case len(c.rbuf) >= n:
		c.w = copy(c.rbuf, c.rbuf[c.r:c.w])
		c.r = 0
	default:
		nb := getStash(n)
		k := copy(*nb, c.rbuf[c.r:c.w])
		c.r = c.w
		c.releaseLocked()
		c.rbp, c.rbuf, c.w = nb, *nb, k
	}
}

// releaseLocked gives the stash's buffer back if the stash is empty. Caller must hold c.mu, or be
// the drain.
func (c *Conn) releaseLocked() {
	if c.r != c.w || c.rbuf == nil {
		return
	}
	putStash(c.rbp)
	c.rbuf, c.rbp, c.r, c.w = nil, nil, 0, 0
}

// fillLocked reads more bytes from the server into the stash: enough for the message at its start
// to be whole, when its size is known. It releases c.mu during the read. Caller must hold c.mu.
func (c *Conn) fillLocked() error {
	need := 0 // the size of the message at the start of the stash, if known
	if _, size, ok := header(c.rbuf[c.r:c.w]); ok && c.cur == 0 {
		need = size
	}
	c.reserveLocked(min(max(need, headerLen), streamAbove))
	end := len(c.rbuf)
	if need > c.w-c.r && c.r+need <= end {
		// No further: once the message is whole and handed on, reads go straight to pgconn.
		end = c.r + need
	}
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(c.rbuf[c.w:end])
	c.mu.Lock()
	c.reading = false
	c.w += n
	if n > 0 {
		return nil
	}
	c.releaseLocked()
	return err
}

// deliverLocked copies into p the messages in the stash that are pgconn's, dropping the replies
// of swallowed requests, and returns how many bytes it copied. Caller must hold c.mu.
func (c *Conn) deliverLocked(p []byte) int {
	if c.r == c.w {
		return 0
	}
	n := 0
	for n < len(p) {
		if c.cur > 0 {
			k := min(c.cur, c.w-c.r, len(p)-n)
			if k == 0 {
				break
			}
			copy(p[n:], c.rbuf[c.r:c.r+k])
			n, c.r, c.cur = n+k, c.r+k, c.cur-k
			continue
		}
		typ, size, ok := header(c.rbuf[c.r:c.w])
		if !ok {
			break
		}
		if !c.sizeOKLocked(typ, size) {
			break
		}
		whole := c.w-c.r >= size
		if !whole && size <= streamAbove {
			break // wait for the rest: pgconn gets whole messages
		}
		var body []byte
		if whole {
			body = c.rbuf[c.r+headerLen : c.r+size]
		}
		if !c.ownedLocked(typ, body) {
			if !whole {
				break // a swallowed reply is small; a huge one waits in the stash
			}
			c.r += size
			continue
		}
		if typ == beReady && whole && len(body) == 1 {
			c.tx = body[0]
		}
		c.cur = size
	}
	c.releaseLocked()
	return n
}

// parseDoneLocked counts a ParseComplete of the oldest request, if it created named statements.
// Caller must hold c.mu.
func (c *Conn) parseDoneLocked() {
	if len(c.reqs[0].parsed) > 0 {
		c.reqs[0].parseDone++
	}
}

// rowsOwnedLocked reports whether a DataRow from the server now is pgconn's, as ownedLocked would
// say (and it would change nothing): a row never ends a request. Caller must hold c.mu.
func (c *Conn) rowsOwnedLocked() bool {
	return c.st == stateStartup || len(c.reqs) == 0 || !c.reqs[0].swallow()
}

// ownedLocked classifies a message from the server, pops the request a ReadyForQuery ends, and
// reports whether pgconn gets the message. body is nil for a message not wholly read yet.
// Caller must hold c.mu.
func (c *Conn) ownedLocked(typ byte, body []byte) bool {
	if c.st == stateStartup {
		if typ == beReady {
			c.st = stateReady
			if len(body) == 1 {
				c.srv = body[0]
			}
		}
		return true
	}
	switch {
	case typ == beNotification, typ == beParamStatus:
		return true // asynchronous: always pgconn's
	case typ == beError && body != nil && fatal(body):
		return true // the server is ending the session: pgconn must know why
	case len(c.reqs) == 0:
		return true
	}
	swallow := c.reqs[0].swallow()
	switch typ {
	case beReady:
		if len(body) == 1 {
			c.srv = body[0]
		}
		c.popLocked()
		if !swallow {
			c.copyIn = false
		}
	case beError:
		if c.reqs[0].staged {
			c.failed = true
		}
	case beCopyIn:
		if !swallow {
			c.copyIn = true
		}
	case beParseDone:
		if !swallow && len(c.reqs[0].parsed) > 0 {
			c.reqs[0].parseSeen++ // pgconn reads it
		}
		c.parseDoneLocked()
	case beComplete:
		if !swallow && body != nil && changesSettings(body) {
			c.settingsChangedLocked()
		}
	}
	return !swallow
}

func (c *Conn) popLocked() {
	c.reqs = c.reqs[1:]
	if len(c.reqs) == 0 {
		// Start over at the front: popping moves reqs along its array, which append would
		// otherwise outgrow every few requests.
		c.reqs = c.reqs0[:0]
	}
}

// inFlightLocked returns the number of pgconn's requests in flight. Caller must hold c.mu.
func (c *Conn) inFlightLocked() int {
	n := 0
	for _, q := range c.reqs {
		if !q.swallow() {
			n++
		}
	}
	return n
}
