package wire

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c // the server reads nothing
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer nc.Close()
	if srv := <-accepted; srv != nil {
		defer srv.Close()
	}
	g := &gatedConn{Conn: nc, entered: make(chan struct{}), gate: make(chan struct{})}
	w := New(g, Options{Ready: true})
	require.Nil(t, w.sock)

	copyFailed := make(chan error, 1)
	go func() { copyFailed <- w.writeCopyFail(time.Now().Add(10 * time.Second)) }()
	<-g.entered // the CopyFail holds smu, its socket write held back

	q := make([]byte, 5+32<<20)
	q[0] = 'Q'
	binary.BigEndian.PutUint32(q[1:], uint32(len(q)-1))
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(q)
		wrote <- err
	}()
	locked := func(f func() bool) func() bool {
		return func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			return f()
		}
	}
	require.Eventually(t, locked(func() bool { return w.writing }), 5*time.Second, time.Millisecond, "the Write waits for smu")
	w.Interrupt(context.DeadlineExceeded)
	require.Eventually(t, locked(func() bool { return w.wdead }), 5*time.Second, time.Millisecond, "wakeWriter took the Write for stalled")
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
