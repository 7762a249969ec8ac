package wire_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
)

// Review finding 1: an Interrupt that arrives while pgconn is idle but the reply of a query queued
// with After (SET LOCAL after a BEGIN, behind a pooler) is still unread is lost: Interrupt calls
// consumeLocked because len(reqs) > 0, consumeLocked finds no request of pgconn's in flight and
// clears the interrupt. The next request, which the documentation says "is ended as soon as it
// is sent", then runs to its end: the budget guard's cancel is ignored.
func TestReviewInterruptLostWhileAfterReplyUnread(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.w.After("set local lock_timeout = 1")
	ch := s.exec(context.Background(), "begin")
	require.Equal(t, "begin", s.expectQuery())
	require.Equal(t, "set local lock_timeout = 1", s.expectQuery())
	// The server answers the BEGIN first and flushes (PostgreSQL flushes at every
	// ReadyForQuery); the SET LOCAL's reply comes later.
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
	r := result(t, ch)
	require.NoError(t, r.firstErr())

	// pgconn is idle: the budget guard interrupts the lease between two statements.
	budget := errors.New("over budget")
	s.w.Interrupt(budget)

	// The SET LOCAL's reply arrives meanwhile.
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("SET")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})

	// The next request must be ended at once (a synthetic 57014) and cancelled on the server.
	ch = s.exec(context.Background(), "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	select {
	case r := <-ch:
		requireCanceled(t, r.firstErr())
	case <-time.After(2 * time.Second):
		// Let the call end so that the test cleans up.
		s.send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
		<-ch
		t.Fatal("the interrupt was lost: the next request ran to its end")
	}
}
