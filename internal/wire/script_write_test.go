package wire_test

import (
	"context"
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

// The same, but the write stalls until the deadline that wakes a stalled write is set (so it
// ends before its first byte): nothing reached the server, so the request is ended as one that
// waited for a drain is. pgconn gets its synthetic end, the server sees nothing, and the settings
// staged in the same write go out with the next request.
func TestScriptInterruptedWriteThatSentNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := newScript(t, scriptOptions)
	// The wrapped TCP socket keeps a write that sent nothing, as a bare one does.
	wire.SetKeepsUnsentWrite(t, func(c net.Conn) bool {
		cc, ok := c.(*cutConn)
		if !ok {
			return false
		}
		_, tcp := cc.Conn.(*net.TCPConn)
		return tcp
	})
	deadlines := make(chan time.Time, 1)
	s.cut.mu.Lock()
	s.cut.deadlines = deadlines
	s.cut.mu.Unlock()
	const set = "SET statement_timeout = 5"
	s.w.Stage(set)
	s.cut.setOnWrite(func() {
		s.w.Interrupt(context.DeadlineExceeded)
		select {
		case <-deadlines:
		case <-time.After(5 * time.Second):
			t.Error("no deadline ended the stalled write")
		}
	})
	r := result(t, s.exec(context.Background(), "select pg_sleep(1)"))
	requireCanceled(t, r.firstErr())
	s.silent(100 * time.Millisecond)
	require.NoError(t, s.w.Err(), "the Conn broke")
	assert.False(t, s.w.Draining(), "nothing was sent: there is nothing to drain")
	assert.ErrorIs(t, s.w.Cause(), context.DeadlineExceeded)
	assert.False(t, s.pc.IsClosed())

	ch := s.exec(context.Background(), "select 'ok'")
	require.Equal(t, set, s.expectQuery(), "the staged settings were not sent, so they go with the next request")
	require.Equal(t, "select 'ok'", s.expectQuery())
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("SET")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	s.answer('I', "ok")
	r = result(t, ch)
	require.NoError(t, r.firstErr())
	assert.Equal(t, []string{"ok"}, rows(r.res[0]))
}

// A write the server does not take (it reads nothing, and the request is larger than both
// sockets' buffers) is still ended by an interrupt, writeStall after it, as pgconn's own deadline
// would end it at once: the caller returns with an error and the Conn breaks, since the server
// has part of a message. The interrupt comes before the write, during it, or from the caller's
// deadline through pgconn's context watcher.
func TestScriptInterruptStalledWriteBreaks(t *testing.T) {
	big := "select '" + strings.Repeat("x", 32<<20) + "'"
	for _, tc := range []string{"before the write", "during the write", "the caller's deadline"} {
		t.Run(tc, func(t *testing.T) {
			s := newScript(t, scriptOptions)
			ctx := context.Background()
			switch tc {
			case "before the write":
				s.w.Interrupt(context.DeadlineExceeded)
			case "during the write":
				s.cut.setOnWrite(func() { s.w.Interrupt(context.DeadlineExceeded) })
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
			assert.Less(t, r.took, 2*time.Second)
			assert.True(t, s.w.Broken(), "the server has part of the request: the Conn must break (%v, after %v)", err, r.took)
		})
	}
}
