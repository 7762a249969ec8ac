package wire_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// The write path at an interrupt: a caller's context that ends while pgconn's request is being
// written. cutConn's onWrite places the interrupt between wire's bookkeeping of the write and its
// system call, the window in which TestDeadlineDuringDrain (integration) lost a session about one
// run in 30: the second call's deadline ended just as the drain of the first ended and released
// the write it held.

func (c *cutConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	f := c.onWrite
	c.onWrite = nil
	c.mu.Unlock()
	if f != nil {
		f()
	}
	return c.Conn.Write(b)
}

func (c *cutConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	c.noteDeadline(t)
	return err
}

func (c *cutConn) SetWriteDeadline(t time.Time) error {
	err := c.Conn.SetWriteDeadline(t)
	c.noteDeadline(t)
	return err
}

// noteDeadline sends t on deadlines, if set, unless t is the zero time.
func (c *cutConn) noteDeadline(t time.Time) {
	c.mu.Lock()
	ch := c.deadlines
	c.mu.Unlock()
	if ch != nil && !t.IsZero() {
		select {
		case ch <- t:
		default:
		}
	}
}

// watchDeadlines returns a channel that receives the next deadline or write deadline set on the
// socket (but the zero one).
func (c *cutConn) watchDeadlines() <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.deadlines = ch
	c.mu.Unlock()
	return ch
}

// NetConn returns the socket, as *tls.Conn does, unless the test hides it (opaque): wire looks
// at it to tell a stalled write from one whose goroutine has not run yet.
func (c *cutConn) NetConn() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opaque {
		return nil
	}
	return c.Conn
}

// setOnWrite arranges for f to run at the start of the next Write.
func (c *cutConn) setOnWrite(f func()) {
	c.mu.Lock()
	c.onWrite = f
	c.mu.Unlock()
}

// The interrupt comes after wire noted the write and before its first byte went out. The write
// is not ended by a deadline (which would break the session, and a TLS one for good): the request
// goes out, pgconn gets its synthetic end at once, and the drain keeps the session.
func TestScriptInterruptAsWriteStarts(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := newScript(t, scriptOptions)
	s.cut.setOnWrite(func() { s.w.Interrupt(context.DeadlineExceeded) })
	r := result(t, s.exec(context.Background(), "select pg_sleep(1)"))
	requireCanceled(t, r.firstErr())
	assert.Less(t, r.took, time.Second, "the interrupt waited for the server")
	require.Equal(t, "select pg_sleep(1)", s.expectQuery(), "the request went out whole")
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean(), "the session was lost")
	assert.False(t, s.pc.IsClosed())
	s.roundTrip()
}

// The interrupt comes after wire noted the write, and the writer's goroutine does not run for
// 5 × writeStall before its system call (descheduled: a loaded machine, a CPU quota): the socket
// takes bytes all along. wakeWriter sees that the server is not what holds the write up, and sets
// no deadline: the request goes out whole, late, and the session is kept, as when the write is
// not held up (TestScriptInterruptAsWriteStarts). pgconn's background reader starts meanwhile
// (after 15 ms of a write) and takes the interrupt. Before, a write deadline ended the write
// with nothing sent, and the session was lost.
func TestScriptDescheduledWriteKeepsSession(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := newScript(t, scriptOptions)
	deadlines := s.cut.watchDeadlines()
	s.cut.setOnWrite(func() {
		s.w.Interrupt(context.DeadlineExceeded)
		time.Sleep(5 * wire.WriteStall)
	})
	r := result(t, s.exec(context.Background(), "select pg_sleep(1)"))
	requireCanceled(t, r.firstErr())
	require.Equal(t, "select pg_sleep(1)", s.expectQuery(), "the request went out whole")
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean(), "the session was lost")
	assert.False(t, s.pc.IsClosed())
	select {
	case d := <-deadlines:
		t.Errorf("a deadline (%v) was set on a write the socket took", d)
	default:
	}
	s.roundTrip()
}

// As TestScriptDescheduledWriteKeepsSession, where wire cannot see the socket (a wrapper that
// hides it, or a platform without poll): it cannot tell a write whose goroutine has not run from
// one the server does not take, so writeStall after the interrupt a write deadline ends the
// write, which sent nothing. The Conn breaks (a TLS session would be unusable; on a plain socket
// the request could be undone, but not without reordering a pipeline's replies or racing the
// background reader, so it is not), the caller returns, and nothing is left running.
func TestScriptStalledUnsentWriteWithBackgroundReader(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := newHiddenScript(t, scriptOptions)
	deadlines := s.cut.watchDeadlines()
	var interrupted time.Time
	s.cut.setOnWrite(func() {
		time.Sleep(40 * time.Millisecond)
		interrupted = time.Now()
		s.w.Interrupt(context.DeadlineExceeded)
		select {
		case <-deadlines:
		case <-time.After(5 * time.Second):
			t.Error("no deadline ended the stalled write")
		}
	})
	r := result(t, s.exec(context.Background(), "select pg_sleep(1)"))
	require.Error(t, r.firstErr())
	assert.Less(t, time.Since(interrupted), time.Second, "the caller returned long after the interrupt")
	assert.True(t, s.w.Broken(), "the write failed: the Conn must break")
	// pgconn closed the session after the write's error; the server got nothing before the end.
	_ = s.srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	m, err := s.be.Receive()
	require.Error(t, err, "the server received %T %+v", m, m)
	assert.False(t, isTimeout(err), "the session was not closed: %v", err)
	assert.True(t, s.pc.IsClosed())
}

// A write the server does not take (it reads nothing, and the request is larger than both
// sockets' buffers) is still ended by an interrupt, writeStall after it, as pgconn's own deadline
// would end it at once: the caller returns with an error and the Conn breaks, since the server
// has part of a message. The interrupt comes before the write, during it, or from the caller's
// deadline through pgconn's context watcher; or during it, and the reader takes it while the
// write stalls: pgconn's background reader, started after 15 ms of a slow write, enters Read
// after the write's deadline was set, and must not clear it (the socket hidden, so that the
// deadline comes writeStall after the interrupt, before the write starts). Last, a write that
// does not start while its socket takes bytes is ended too, once wakeWriter has looked at it
// maxWriteLooks times (about a second): wire's wait for a write is bounded whatever the socket
// says.
func TestScriptInterruptStalledWriteBreaks(t *testing.T) {
	big := "select '" + strings.Repeat("x", 32<<20) + "'"
	for _, tc := range []string{"before the write", "during the write", "the caller's deadline", "the reader takes it", "the write does not start"} {
		t.Run(tc, func(t *testing.T) {
			var s *script
			if tc == "the reader takes it" {
				s = newHiddenScript(t, scriptOptions)
			} else {
				s = newScript(t, scriptOptions)
			}
			ctx := context.Background()
			deadlines := s.cut.watchDeadlines()
			var writeStart atomic.Int64 // when the write began, in Unix nanoseconds
			started := func() { writeStart.Store(time.Now().UnixNano()) }
			switch tc {
			case "before the write":
				s.w.Interrupt(context.DeadlineExceeded)
				s.cut.setOnWrite(started)
			case "during the write":
				s.cut.setOnWrite(func() {
					started()
					s.w.Interrupt(context.DeadlineExceeded)
				})
			case "the reader takes it":
				s.cut.setOnWrite(func() {
					s.w.Interrupt(context.DeadlineExceeded)
					<-deadlines
					// The background reader starts and takes the interrupt: a drain begins.
					assert.Eventually(t, s.w.Draining, 5*time.Second, time.Millisecond)
				})
			case "the write does not start":
				s.cut.setOnWrite(func() {
					start := time.Now()
					s.w.Interrupt(context.DeadlineExceeded)
					select {
					case <-deadlines:
						// Timers never fire early: maxWriteLooks looks take that many writeStalls.
						assert.GreaterOrEqual(t, time.Since(start), wire.MaxWriteLooks*wire.WriteStall*9/10,
							"the deadline came while the socket's buffer had room")
					case <-time.After(20 * time.Second):
						t.Error("no deadline ended the write")
					}
				})
			default:
				s.cut.setOnWrite(started)
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
				defer cancel()
			}
			r := result(t, s.exec(ctx, big))
			err := r.firstErr()
			require.Error(t, err)
			if tc == "the caller's deadline" {
				assert.True(t, pgconn.Timeout(err), "want a timeout, got %v", err)
			}
			assert.Less(t, r.took, 20*time.Second)
			assert.True(t, s.w.Broken(), "the server has part of the request: the Conn must break (%v, after %v)", err, r.took)
			if start := writeStart.Load(); start != 0 {
				// The socket's buffer is full: wakeWriter sees the write stalled at its first
				// looks, not after its last.
				select {
				case d := <-deadlines:
					assert.Less(t, d.Sub(time.Unix(0, start)), wire.MaxWriteLooks*wire.WriteStall/2,
						"a stalled write was taken for one that had not started")
				default:
					t.Error("no deadline ended the write")
				}
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// wakeWriter tells a stalled write by its socket's send buffer: no room while the server reads
// nothing (TCP, Unix, and through a *tls.Conn), room on an idle socket; nothing to tell through a
// wrapper that hides the socket.
func TestWritableSeesAStalledSocket(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			c, _ := wire.SocketPair(t, network)
			assert.True(t, wire.Writable(c), "an idle socket")
			assert.True(t, wire.Writable(tls.Client(c, &tls.Config{ServerName: "localhost"})), "through a *tls.Conn")
			assert.False(t, wire.Writable(struct{ net.Conn }{c}), "a wrapper that hides the socket")
			done := make(chan error, 1)
			go func() {
				_, err := c.Write(make([]byte, 64<<20)) // the server reads nothing
				done <- err
			}()
			assert.Eventually(t, func() bool { return !wire.Writable(c) }, 5*time.Second, time.Millisecond, "a stalled socket")
			assert.False(t, wire.Writable(tls.Client(c, &tls.Config{ServerName: "localhost"})), "a stalled socket through a *tls.Conn")
			require.NoError(t, c.SetWriteDeadline(time.Now()))
			require.Error(t, <-done)
		})
	}
}

// lockedConn is a wrapper of the user's that holds its own mutex across its Write, and in
// NetConn.
type lockedConn struct {
	net.Conn
	mu sync.Mutex
}

func (c *lockedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *lockedConn) NetConn() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn
}

// wire asks a wrapper for its socket once, at New, and never while a write is under way or while
// it holds its own mutex: a wrapper whose NetConn waits for its write (lockedConn) cannot wedge
// the Conn. A write the server does not take is ended after an interrupt, and Close returns.
// (Found by review: wakeWriter asked for the socket at each look, holding wire's mutex; with such
// a wrapper the write was never ended and Close hung.)
func TestWrapperNetConnDoesNotWedge(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c, _ := wire.SocketPair(t, "tcp")
	w := wire.New(&lockedConn{Conn: c}, wire.Options{Ready: true})
	q := make([]byte, 5+32<<20)
	q[0] = 'Q'
	binary.BigEndian.PutUint32(q[1:], uint32(len(q)-1))
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(q)
		wrote <- err
	}()
	assert.Eventually(t, func() bool { return !wire.Writable(c) }, 5*time.Second, time.Millisecond, "the write stalls")
	w.Interrupt(context.DeadlineExceeded)
	select {
	case err := <-wrote:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		_ = c.Close() // unwedge, then fail
		<-wrote
		t.Fatal("the interrupted write was not ended")
	}
	closed := make(chan struct{})
	go func() {
		_ = w.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		_ = c.Close()
		t.Fatal("Close hangs")
	}
}
