package wire_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
)

// Review finding 3: consumeLocked replaces c.out (append(c.out[:0], ...)) instead of appending
// to it. When Interrupt consumes the interrupt itself (pgconn between its write and its read),
// whatever a drain kept in out for pgconn and pgconn has not read yet (a NotificationResponse, a
// ParameterStatus, a notice) is lost.
func TestReviewInterruptDropsMessagesKeptByTheDrain(t *testing.T) {
	s := newScript(t, scriptOptions)
	// A statement cut by its context; the server sends a notification during the drain.
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	s.send(
		&pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: "kept by the drain"},
		canceled(),
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	require.NoError(t, s.waitClean())

	// pgconn's next request is written; an interrupt comes before pgconn reads.
	fe := s.pc.Frontend()
	fe.Send(&pgproto3.Query{String: "select 1"})
	require.NoError(t, fe.Flush())
	require.Equal(t, "select 1", s.expectQuery())
	s.w.Interrupt(errors.New("over budget"))

	var got []pgproto3.BackendMessage
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	for {
		m, err := s.pc.ReceiveMessage(rctx)
		require.NoError(t, err)
		if n, ok := m.(*pgproto3.NotificationResponse); ok {
			n2 := *n
			got = append(got, &n2)
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	require.Len(t, got, 1, "the notification the drain kept for pgconn was lost")
}

// Review finding 4: the drain drops a message larger than its buffer (8 KiB) as it arrives,
// without looking at its type (skip: c.cur), so a NoticeResponse of the cut request (or a FATAL
// ErrorResponse, or a NotificationResponse) over 8 KiB never reaches pgconn, although skip keeps
// such messages for pgconn when they are smaller.
func TestReviewDrainDropsALargeNotice(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	big := make([]byte, 12<<10)
	for i := range big {
		big[i] = 'n'
	}
	s.send(
		&pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: "small"},
		&pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: string(big)},
		canceled(),
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	require.NoError(t, s.waitClean())
	s.roundTrip() // pgconn reads what the drain kept
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.notices, 2, "the drain kept the small notice and dropped the large one")
}

// Review finding 3, second form: Read hands out c.out in pieces as large as the caller's buffer,
// and does not note (as c.cur does for the stash) that the caller holds only the start of a
// message. When Interrupt then calls consumeLocked, c.out is replaced by the synthetic end: the
// reader, which had the first bytes of a message kept by the drain, gets an ErrorResponse where
// the rest of that message should be, and the stream is torn. pgproto3's chunk reader reads into
// the free end of its buffer, so a read that ends inside a message is ordinary.
func TestReviewInterruptTearsAMessageKeptByTheDrain(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	notice := &pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: "kept by the drain for pgconn"}
	s.send(notice, canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	want, err := notice.Encode(nil)
	require.NoError(t, err)

	fe := s.pc.Frontend()
	fe.Send(&pgproto3.Query{String: "select 1"})
	require.NoError(t, fe.Flush())
	require.Equal(t, "select 1", s.expectQuery())

	// The reader's buffer has room for the start of the notice only.
	head := make([]byte, 10)
	n, err := s.w.Read(head)
	require.NoError(t, err)
	require.Equal(t, want[:n], head[:n])
	s.w.Interrupt(errors.New("over budget"))
	rest := make([]byte, len(want)-n)
	m, err := s.w.Read(rest)
	require.NoError(t, err)
	require.Equal(t, want[n:n+m], rest[:m], "the rest of the notice was replaced by the synthetic end: a torn message")
}
