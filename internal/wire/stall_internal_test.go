package wire

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gatedConn holds its first Write until gate is closed, and hides its socket from wire.
type gatedConn struct {
	net.Conn
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (c *gatedConn) Write(b []byte) (int, error) {
	first := false
	c.once.Do(func() { first = true })
	if first {
		close(c.entered)
		<-c.gate
	}
	return c.Conn.Write(b)
}

// A drain's CopyFail holds the socket's write mutex while a Write waits for it; an interrupt
// comes, and wakeWriter takes that Write for stalled (the socket hidden) and sets its deadline.
// The CopyFail, once written, must leave that deadline for the Write, which the server does not
// take: the Write then ends, and the Conn breaks. (Found by review: writeCopyFail cleared every
// write deadline, and the Write, its deadline gone and wakeWriter done with it, hung.)
func TestCopyFailLeavesAStalledWritesDeadline(t *testing.T) {
	nc := stalledPeer(t)
	g := &gatedConn{Conn: nc, entered: make(chan struct{}), gate: make(chan struct{})}
	w := New(g, Options{Ready: true})
	require.Nil(t, w.sock)

	copyFailed := make(chan error, 1)
	go func() { copyFailed <- w.writeCopyFail(time.Now().Add(10 * time.Second)) }()
	<-g.entered // the CopyFail holds smu, its socket write held back

	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(bigQuery())
		wrote <- err
	}()
	require.Eventually(t, w.locked(func() bool { return w.writing }), 5*time.Second, time.Millisecond, "the Write waits for smu")
	w.Interrupt(context.DeadlineExceeded)
	require.Eventually(t, w.locked(func() bool { return w.wdead }), 5*time.Second, time.Millisecond, "wakeWriter took the Write for stalled")
	close(g.gate)
	<-copyFailed // ended by the deadline, or written: either way the Write must end
	select {
	case err := <-wrote:
		require.Error(t, err)
		require.True(t, w.Broken())
	case <-time.After(10 * time.Second):
		_ = nc.Close()
		<-wrote
		t.Fatal("the stalled Write hung: the CopyFail cleared its deadline")
	}
}

// stalledPeer returns the client end of a loopback TCP connection whose server reads nothing.
func stalledPeer(t *testing.T) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	srv := <-accepted
	t.Cleanup(func() {
		_ = nc.Close()
		if srv != nil {
			_ = srv.Close()
		}
	})
	return nc
}

// bigQuery is a Query message larger than both sockets' buffers.
func bigQuery() []byte {
	q := make([]byte, 5+32<<20)
	q[0] = 'Q'
	binary.BigEndian.PutUint32(q[1:], uint32(len(q)-1))
	return q
}

// locked returns f run under c.mu.
func (c *Conn) locked(f func() bool) func() bool {
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return f()
	}
}

// A pending interrupt cleared (pgconn's HandleUnwatchAfterCancel, or the end of a lease) while a
// Write that wakeWriter took for stalled waits for the socket: the Write's deadline stays, and the
// Write ends. (Found by review: ClearInterrupt cleared every deadline.)
func TestClearInterruptKeepsAStalledWritesDeadline(t *testing.T) {
	nc := stalledPeer(t)
	w := New(struct{ net.Conn }{nc}, Options{Ready: true}) // the socket hidden: stalled at the first look
	w.smu.Lock()                                           // a write of the drain's holds the socket
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(bigQuery())
		wrote <- err
	}()
	require.Eventually(t, w.locked(func() bool { return w.writing }), 5*time.Second, time.Millisecond, "the Write waits for smu")
	w.Interrupt(context.DeadlineExceeded)
	require.Eventually(t, w.locked(func() bool { return w.wdead }), 5*time.Second, time.Millisecond, "wakeWriter took the Write for stalled")
	w.ClearInterrupt()
	w.smu.Unlock()
	select {
	case err := <-wrote:
		require.Error(t, err)
		require.True(t, w.Broken())
	case <-time.After(10 * time.Second):
		_ = nc.Close()
		<-wrote
		t.Fatal("the stalled Write hung: ClearInterrupt cleared its deadline")
	}
}

// hookedRaw runs before at its first Control, then the socket's own.
type hookedRaw struct {
	syscall.RawConn
	once   sync.Once
	before func()
}

func (h *hookedRaw) Control(f func(uintptr)) error {
	h.once.Do(h.before)
	return h.RawConn.Control(f)
}

// wakeWriter polls without c.mu: between its check that write seq is still under way and its
// poll, that write may end and the next begin, with no interrupt for it. A full buffer then must
// not earn the next write a deadline: wakeWriter checks again after the poll. (From review.)
func TestWakeWriterChecksAgainAfterThePoll(t *testing.T) {
	nc := stalledPeer(t)
	w := New(nc, Options{Ready: true})
	require.NotNil(t, w.sock)
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		_, _ = nc.Write(make([]byte, 64<<20)) // fills the send buffer, until the deadline below
	}()
	require.Eventually(t, func() bool { return !pollWritable(w.sock) }, 5*time.Second, time.Millisecond)
	w.mu.Lock()
	w.writing, w.wseq = true, 1
	w.mu.Unlock()
	w.sock = &hookedRaw{RawConn: w.sock, before: func() {
		w.mu.Lock()
		w.wseq = 2 // write 1 returned and write 2 began
		w.mu.Unlock()
	}}
	w.wakeWriter(1, 1)
	require.False(t, w.locked(func() bool { return w.wdead })(), "a deadline was set on write 2, which no interrupt hit")
	_ = nc.SetWriteDeadline(time.Now())
	<-filled
}
