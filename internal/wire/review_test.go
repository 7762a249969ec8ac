package wire_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
)

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
