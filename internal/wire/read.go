package wire

import "time"

// Read hands pgconn the server's bytes, without the replies of staged queries, and a synthetic
// end of a request that an interrupt ended.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if len(c.out) > 0 {
			n := copy(p, c.out)
			c.out = c.out[n:]
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
		if err := c.fillLocked(); err != nil {
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

// fillLocked reads more bytes from the server into rbuf. It releases c.mu during the read.
// Caller must hold c.mu.
func (c *Conn) fillLocked() error {
	if c.r == c.w {
		c.r, c.w = 0, 0
		if cap(c.rbuf) > 4*streamAbove {
			c.rbuf = make([]byte, 8192)
		}
	}
	if c.w == len(c.rbuf) {
		if c.r > 0 {
			c.w = copy(c.rbuf, c.rbuf[c.r:c.w])
			c.r = 0
		} else {
			nb := make([]byte, 2*len(c.rbuf))
			copy(nb, c.rbuf[:c.w])
			c.rbuf = nb
		}
	}
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(c.rbuf[c.w:])
	c.mu.Lock()
	c.reading = false
	c.w += n
	if n > 0 {
		return nil
	}
	return err
}

// deliverLocked copies into p the messages in rbuf that are pgconn's, dropping the replies of
// swallowed requests, and returns how many bytes it copied. Caller must hold c.mu.
func (c *Conn) deliverLocked(p []byte) int {
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
				break // a swallowed reply is small; a huge one waits in rbuf
			}
			c.r += size
			continue
		}
		if typ == beReady && whole && len(body) == 1 {
			c.tx = body[0]
		}
		c.cur = size
	}
	return n
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
	}
	return !swallow
}

func (c *Conn) popLocked() {
	c.reqs = c.reqs[1:]
	if len(c.reqs) == 0 {
		c.reqs = c.reqs[:0:cap(c.reqs)]
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
