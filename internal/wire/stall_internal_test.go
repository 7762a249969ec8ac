package wire

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
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

	wrote := stallWaitingWrite(t, w)
	close(g.gate)
	<-copyFailed // ended by the deadline, or written: either way the Write must end
	requireWriteEnds(t, w, nc, wrote, "the CopyFail cleared its deadline")
}

// stalledPeer returns the client end of a loopback TCP connection whose server reads nothing.
func stalledPeer(t *testing.T) net.Conn {
	t.Helper()
	c, _ := SocketPair(t, "tcp")
	return c
}

// SocketPair returns both ends of a loopback connection on network ("tcp" or "unix"), closed when
// t ends. (Exported for the package's external tests.)
func SocketPair(t *testing.T, network string) (client, server net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial(network, ln.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	t.Cleanup(func() {
		_ = client.Close()
		_ = server.Close()
	})
	return client, server
}

// stallWaitingWrite starts a Write of bigQuery on w that waits for smu (which the caller holds),
// interrupts it, and waits until wakeWriter has taken it for stalled (the socket hidden, so at its
// first look). It returns the Write's result.
func stallWaitingWrite(t *testing.T, w *Conn) <-chan error {
	t.Helper()
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(bigQuery())
		wrote <- err
	}()
	require.Eventually(t, w.locked(func() bool { return w.writing }), 5*time.Second, time.Millisecond, "the Write waits for smu")
	w.Interrupt(context.DeadlineExceeded)
	require.Eventually(t, w.locked(func() bool { return w.wdead }), 5*time.Second, time.Millisecond, "wakeWriter took the Write for stalled")
	return wrote
}

// requireWriteEnds requires the Write whose result is wrote to end with an error, and w to break,
// within 10 s; else it closes nc (the Write then ends) and fails, saying why the Write hung.
func requireWriteEnds(t *testing.T, w *Conn, nc net.Conn, wrote <-chan error, why string) {
	t.Helper()
	select {
	case err := <-wrote:
		require.Error(t, err)
		require.True(t, w.Broken())
	case <-time.After(10 * time.Second):
		_ = nc.Close()
		<-wrote
		t.Fatal("the stalled Write hung: " + why)
	}
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
	wrote := stallWaitingWrite(t, w)
	w.ClearInterrupt()
	w.smu.Unlock()
	requireWriteEnds(t, w, nc, wrote, "ClearInterrupt cleared its deadline")
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

// ClearInterrupt during a drain leaves the socket's deadlines to the drain, even with a Write
// under way that wakeWriter took for stalled: the drain's read deadline bounds its wait for the
// server.
func TestClearInterruptLeavesTheDrainsDeadline(t *testing.T) {
	nc := stalledPeer(t)
	w := New(nc, Options{Ready: true})
	w.mu.Lock()
	w.st, w.writing, w.wdead, w.intr = stateDraining, true, true, context.DeadlineExceeded
	w.mu.Unlock()
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(50*time.Millisecond))) // the drain's
	w.ClearInterrupt()
	read := make(chan error, 1)
	go func() {
		_, err := nc.Read(make([]byte, 1)) // the server sends nothing
		read <- err
	}()
	select {
	case err := <-read:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(10 * time.Second):
		_ = nc.Close()
		<-read
		t.Fatal("the drain's read deadline was cleared")
	}
}
