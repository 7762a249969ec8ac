package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// link is one proxied connection: a client socket and a server socket.
type link struct {
	p              *Proxy
	client, server net.Conn
	done           chan struct{} // closed when the link is torn down
	once           sync.Once
	halves         atomic.Int32 // directions still forwarding; at 0 the link closes
}

// chunk is data read from one side, with the time it was read. A chunk with err set ends the
// direction: io.EOF is forwarded as a half close, other errors as a reset.
type chunk struct {
	data []byte
	at   time.Time
	err  error
}

// forward starts the reader and the writer of direction i, from src to dst.
func (l *link) forward(i int, src, dst net.Conn) {
	q := make(chan chunk, chunkQueue)
	go l.read(i, src, q)
	go l.write(i, dst, q)
}

// read reads src into q while direction i is open. It does not read while the direction is
// blackholed.
func (l *link) read(i int, src net.Conn, q chan<- chunk) {
	defer l.p.wg.Done()
	buf := make([]byte, readSize)
	for {
		if !l.p.waitOpen(i, l.done) {
			return
		}
		n, err := src.Read(buf)
		at := time.Now()
		if n > 0 {
			select {
			case q <- chunk{data: append([]byte(nil), buf[:n]...), at: at}:
			case <-l.done:
				return
			}
		}
		if err != nil {
			select {
			case q <- chunk{at: at, err: err}:
			case <-l.done:
			}
			return
		}
	}
}

// write writes the chunks of q to dst, each when its latency has passed and the direction is not
// blackholed.
func (l *link) write(i int, dst net.Conn, q <-chan chunk) {
	defer l.p.wg.Done()
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		var c chunk
		select {
		case c = <-q:
		case <-l.done:
			return
		}
		latency, _ := l.p.faults(i)
		if wait := time.Until(c.at.Add(latency)); wait > 0 {
			if t == nil {
				t = time.NewTimer(wait)
			} else {
				t.Reset(wait)
			}
			select {
			case <-t.C:
			case <-l.done:
				return
			}
		}
		if !l.p.waitOpen(i, l.done) {
			return
		}
		if c.err != nil {
			if isEOF(c.err) {
				l.halfClose(dst)
			} else {
				l.abort()
			}
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			l.abort()
			return
		}
	}
}

// halfClose forwards the end of one direction: it shuts down writing on dst, or closes the link
// if dst cannot half-close. When both directions have ended, the link closes.
func (l *link) halfClose(dst net.Conn) {
	cw, ok := dst.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		l.close()
		return
	}
	if l.halves.Add(-1) == 0 {
		l.close()
	}
}

// close closes both sockets normally and ends the link's goroutines.
func (l *link) close() { l.end(false) }

// abort closes both sockets with a reset.
func (l *link) abort() { l.end(true) }

func (l *link) end(reset bool) {
	l.once.Do(func() {
		close(l.done)
		if reset {
			abortConn(l.client)
			abortConn(l.server)
		} else {
			_ = l.client.Close()
			_ = l.server.Close()
		}
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	})
}

// abortConn closes c with a TCP RST where c is a TCP connection.
func abortConn(c net.Conn) {
	if tc, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
