package wire

import (
	"context"
	"net"
)

// Wait waits until no drain is under way, or ctx ends. Only the tests wait for a drain: pgxlanes
// is told by OnClean.
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

// Err returns why the Conn broke, or nil.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != stateBroken {
		return nil
	}
	return c.err
}

// Held returns the bytes of buffer an idle Conn holds of its own: the stash and the synthetic end
// (a write's buffer is pooled). It is 0 once every byte read was handed on.
func (c *Conn) Held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cap(c.rbuf) + cap(c.out)
}

// WriteStall and MaxWriteLooks are writeStall and maxWriteLooks, for the tests of the write path
// at an interrupt.
const (
	WriteStall    = writeStall
	MaxWriteLooks = maxWriteLooks
)

// Writable reports whether wakeWriter would find c's send buffer with room now.
func Writable(c net.Conn) bool {
	rc := SocketOf(c)
	return rc != nil && pollWritable(rc)
}
