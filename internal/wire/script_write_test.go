package wire_test

import (
	"context"
	"errors"
	"net"
	"strings"
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

// hide hides the socket from wire (see opaque).
func (c *cutConn) hide() {
	c.mu.Lock()
	c.opaque = true
	c.mu.Unlock()
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
	s := newScript(t, scriptOptions)
	s.cut.hide()
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
			s := newScript(t, scriptOptions)
			ctx := context.Background()
			switch tc {
			case "before the write":
				s.w.Interrupt(context.DeadlineExceeded)
			case "during the write":
				s.cut.setOnWrite(func() { s.w.Interrupt(context.DeadlineExceeded) })
			case "the reader takes it":
				s.cut.hide()
				deadlines := s.cut.watchDeadlines()
				s.cut.setOnWrite(func() {
					s.w.Interrupt(context.DeadlineExceeded)
					<-deadlines
					// The background reader starts and takes the interrupt: a drain begins.
					assert.Eventually(t, s.w.Draining, 5*time.Second, time.Millisecond)
				})
			case "the write does not start":
				deadlines := s.cut.watchDeadlines()
				s.cut.setOnWrite(func() {
					start := time.Now()
					s.w.Interrupt(context.DeadlineExceeded)
					select {
					case <-deadlines:
						assert.Greater(t, time.Since(start), 10*wire.WriteStall, "the deadline came while the socket took bytes")
					case <-time.After(10 * time.Second):
						t.Error("no deadline ended the write")
					}
				})
			default:
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
			assert.Less(t, r.took, 5*time.Second)
			assert.True(t, s.w.Broken(), "the server has part of the request: the Conn must break (%v, after %v)", err, r.took)
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
