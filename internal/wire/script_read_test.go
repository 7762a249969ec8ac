package wire_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The read path (read.go): wire reads the socket straight into pgconn's buffer and frames the
// bytes there, keeping back the start of a message that a read cut. These tests place the ends of
// the client's reads at chosen offsets of the server's stream (cutConn), so that every way a
// message can be cut by a read is a deterministic case.

// cutConn is the client's socket under the wire.Conn. Its reads never return bytes across a cut:
// an offset in the server's stream, so that where a read ends does not depend on timing.
type cutConn struct {
	net.Conn
	mu    sync.Mutex
	pos   int   // bytes read so far
	cuts  []int // offsets in the stream, ascending
	every bool  // every read returns at most one byte

	// onWrite, when set, runs at the start of the next Write, before the socket is written: the
	// place between wire's bookkeeping of a write and its system call (script_write_test.go).
	onWrite func()
	// deadlines, when set, receives every deadline or write deadline set on the socket but the
	// zero one.
	deadlines chan time.Time
	// opaque hides the socket from wire (NetConn returns nil), as a wrapper of the user's that
	// does not expose what it wraps would: wire cannot tell whether a write is stalled.
	opaque bool
	// joinEOF makes a read that got bytes go on reading until the socket ends, and return the
	// bytes with the error, as a *tls.Conn does with a close_notify right behind the data.
	joinEOF bool
	// onRead, when set, runs once a read that got bytes returns from the socket, before wire
	// has them: an interrupt there lands during the read.
	onRead func()
}

func (c *cutConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	for len(c.cuts) > 0 && c.cuts[0] <= c.pos {
		c.cuts = c.cuts[1:]
	}
	limit := len(p)
	if len(c.cuts) > 0 {
		limit = min(limit, c.cuts[0]-c.pos)
	}
	if c.every {
		limit = min(limit, 1)
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p[:limit])
	c.mu.Lock()
	join := c.joinEOF
	c.mu.Unlock()
	for join && n > 0 && n < limit && err == nil {
		var k int
		k, err = c.Conn.Read(p[n:limit])
		n += k
	}
	c.mu.Lock()
	c.pos += n
	f := c.onRead
	if n > 0 {
		c.onRead = nil
	}
	c.mu.Unlock()
	if f != nil && n > 0 {
		f()
	}
	return n, err
}

// cutAt places cuts at offsets from the next byte the client reads; every makes each read a
// single byte until reset.
func (c *cutConn) cutAt(every bool, offsets ...int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cuts = c.cuts[:0]
	for _, k := range offsets {
		c.cuts = append(c.cuts, c.pos+k)
	}
	c.every = every
}

func textColumn() *pgproto3.RowDescription {
	return &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}}
}

// A staged SET's reply and a query's reply in one stream, the client's read cut at every offset of
// it, and once with every read a single byte: pgconn gets the query's reply whole (the SET's cut
// out of its buffer), each notice and notification once, and wire holds no buffer afterwards.
func TestScriptReplySplitAtEveryOffset(t *testing.T) {
	s := newScript(t, scriptOptions)
	stream := func(round int) []byte {
		return encode(t,
			&pgproto3.CommandComplete{CommandTag: []byte("SET")},
			&pgproto3.ParameterStatus{Name: "p", Value: fmt.Sprint(round)},
			&pgproto3.ReadyForQuery{TxStatus: 'I'},
			textColumn(),
			&pgproto3.DataRow{Values: [][]byte{[]byte("a")}},
			&pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: fmt.Sprint(round)},
			&pgproto3.DataRow{Values: [][]byte{[]byte("b")}},
			&pgproto3.CommandComplete{CommandTag: []byte("SELECT 2")},
			&pgproto3.ReadyForQuery{TxStatus: 'I'},
		)
	}
	n := len(stream(0))
	for k := 0; k < n; k++ { // k == 0: every read a single byte
		s.w.Stage(fmt.Sprintf("SET p = %d", k))
		ch := s.exec(context.Background(), "select v")
		require.Equal(t, fmt.Sprintf("SET p = %d", k), s.expectQuery())
		require.Equal(t, "select v", s.expectQuery())
		s.cut.cutAt(k == 0, k)
		s.sendRaw(stream(k))
		r := result(t, ch)
		require.NoError(t, r.firstErr(), "cut at %d", k)
		require.Len(t, r.res, 1, "cut at %d: the SET's result reached pgconn", k)
		assert.Equal(t, []string{"a", "b"}, rows(r.res[0]), "cut at %d", k)
		assert.Equal(t, fmt.Sprint(k), s.pc.ParameterStatus("p"), "cut at %d", k)
		assert.False(t, s.w.Failed())
		assert.Zero(t, s.w.Held(), "cut at %d: an idle connection holds a buffer", k)
	}
	s.mu.Lock()
	require.Len(t, s.notices, n)
	for k, notice := range s.notices {
		assert.Equal(t, fmt.Sprint(k), notice.Message)
	}
	s.mu.Unlock()
}

// A row larger than pgconn's buffer (8 KiB), and one larger than streamAbove, the client's reads
// cut inside their headers, around pgconn's buffer's end, and one byte before their end: pgconn
// gets them whole.
func TestScriptLargeRowSplitAcrossReads(t *testing.T) {
	s := newScript(t, scriptOptions)
	head := encode(t, textColumn(), &pgproto3.DataRow{Values: [][]byte{[]byte("small")}})
	for _, size := range []int{8 << 10, 20 << 10, 300 << 10} {
		big := strings.Repeat("z", size)
		row := encode(t, &pgproto3.DataRow{Values: [][]byte{[]byte(big)}})
		tail := encode(t, &pgproto3.DataRow{Values: [][]byte{[]byte("after")}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 3")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
		stream := append(append(append([]byte{}, head...), row...), tail...)
		at := len(head)
		for _, cuts := range [][]int{
			{at + 1}, {at + 3}, {at + 5}, {at + 6},
			{8191}, {8192}, {8193}, {at + 8192}, {at + 8192, at + 16384},
			{at + len(row) - 1}, {at + len(row) + 2},
			{at + 2, at + 4, at + 100, at + 9000, at + len(row) - 1},
		} {
			ch := s.exec(context.Background(), "select big")
			s.expectQuery()
			s.cut.cutAt(false, cuts...)
			s.sendRaw(stream)
			r := result(t, ch)
			require.NoError(t, r.firstErr(), "size %d cuts %v", size, cuts)
			require.Equal(t, []string{"small", big, "after"}, rows(r.res[0]), "size %d cuts %v", size, cuts)
			assert.Zero(t, s.w.Held(), "size %d cuts %v: an idle connection holds a buffer", size, cuts)
		}
	}
	s.roundTrip()
}

// An interrupt after every offset of a reply: the drain starts where the read left off, in the
// middle of a header or of a body (the start of that message kept back from pgconn). pgconn gets
// whole messages and a synthetic end; the drain drops the rest of the cut message and every
// later one; the session is kept, and wire holds no buffer once it is idle again.
func TestScriptInterruptAtEveryOffset(t *testing.T) {
	s := newScript(t, scriptOptions)
	reply := encode(t,
		textColumn(),
		&pgproto3.DataRow{Values: [][]byte{[]byte("a")}},
		&pgproto3.DataRow{Values: [][]byte{bytes.Repeat([]byte("b"), 40)}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("c")}},
	)
	for k := 0; k <= len(reply); k++ {
		ctx, cancel := context.WithCancel(context.Background())
		ch := s.exec(ctx, "select v")
		s.expectQuery()
		base := s.cut.at()
		s.sendRaw(reply[:k])
		s.waitRead(base + k)
		cancel()
		requireCanceled(t, result(t, ch).firstErr())
		s.awaitCancel()
		s.sendRaw(reply[k:])
		s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
		require.NoError(t, s.waitClean(), "interrupt after %d bytes", k)
		s.roundTrip()
		assert.Zero(t, s.w.Held(), "interrupt after %d bytes: an idle connection holds a buffer", k)
	}
}

// An interrupt while a row larger than pgconn's buffer is arriving, and one while a row over
// streamAbove has sent only part of its header: pgconn has not begun either (wire keeps back a
// message until it is whole, up to streamAbove), so the session is kept.
func TestScriptInterruptInsideRowLargerThanBuffer(t *testing.T) {
	s := newScript(t, scriptOptions)
	for _, tc := range []struct {
		size, sent int
	}{{20 << 10, 10 << 10}, {20 << 10, 3}, {300 << 10, 3}} {
		row := encode(t, &pgproto3.DataRow{Values: [][]byte{bytes.Repeat([]byte("r"), tc.size)}})
		head := encode(t, textColumn())
		ctx, cancel := context.WithCancel(context.Background())
		ch := s.exec(ctx, "select big")
		s.expectQuery()
		base := s.cut.at()
		s.sendRaw(append(head, row[:tc.sent]...))
		s.waitRead(base + len(head) + tc.sent)
		cancel()
		requireCanceled(t, result(t, ch).firstErr())
		s.awaitCancel()
		s.sendRaw(row[tc.sent:])
		s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
		require.NoError(t, s.waitClean(), "row of %d bytes, %d sent", tc.size, tc.sent)
		s.roundTrip()
		assert.Zero(t, s.w.Held())
	}
}

// at returns how many bytes the client has read.
func (c *cutConn) at() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos
}

// waitRead waits until the client has read n bytes in all, and a little more, so that an
// interrupt finds them read and framed.
func (s *script) waitRead(n int) {
	s.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.cut.at() < n {
		require.True(s.t, time.Now().Before(deadline), "the client read %d bytes of %d", s.cut.at(), n)
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
}

// A length the protocol cannot have (under the header's own 4 bytes, or a ReadyForQuery that is
// not 6 bytes long) breaks the Conn: the call fails, nothing panics.
func TestScriptMalformedLengthBreaks(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  []byte
		cuts []int
	}{
		{"short length", []byte{'D', 0, 0, 0, 2}, nil},
		{"short length after a cut header", []byte{'D', 0, 0, 0, 2}, []int{3}},
		{"long ReadyForQuery", []byte{'Z', 0, 0, 0, 6, 'I', 'I'}, nil},
		{"short length after a message cut by a read", append(encode(t, textColumn()), 'D', 0, 0, 0, 3), []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(t, scriptOptions)
			ch := s.exec(context.Background(), "select v")
			s.expectQuery()
			s.cut.cutAt(false, tc.cuts...)
			s.sendRaw(tc.raw)
			r := result(t, ch)
			require.Error(t, r.firstErr())
			assert.True(t, s.w.Broken())
			assert.ErrorContains(t, s.w.Err(), "malformed")
		})
	}
}

// Rows of a reply that pgconn does not get (a staged query's before pgconn's, a queued one's
// after it) are dropped wherever the client's read is cut, also when they come in the same read
// as pgconn's own rows: pgconn gets its rows, and only those.
func TestScriptRowsOfSwallowedReplies(t *testing.T) {
	s := newScript(t, scriptOptions)
	reply := func(tag string, vals ...string) []pgproto3.BackendMessage {
		msgs := []pgproto3.BackendMessage{textColumn()}
		for _, v := range vals {
			msgs = append(msgs, &pgproto3.DataRow{Values: [][]byte{[]byte(v)}})
		}
		return append(msgs, &pgproto3.CommandComplete{CommandTag: []byte(tag)}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	}
	var msgs []pgproto3.BackendMessage
	msgs = append(msgs, reply("SELECT 2", "staged1", "staged2")...)
	msgs = append(msgs, reply("SELECT 3", "a", "b", "c")...)
	msgs = append(msgs, reply("SELECT 2", "after1", "after2")...)
	stream := encode(t, msgs...)
	for k := 0; k < len(stream); k++ { // k == 0: every read a single byte
		s.w.Stage(fmt.Sprintf("select staged %d", k))
		s.w.After("select after")
		ch := s.exec(context.Background(), "select v")
		require.Equal(t, fmt.Sprintf("select staged %d", k), s.expectQuery())
		require.Equal(t, "select v", s.expectQuery())
		require.Equal(t, "select after", s.expectQuery())
		s.cut.cutAt(k == 0, k)
		s.sendRaw(stream)
		r := result(t, ch)
		require.NoError(t, r.firstErr(), "cut at %d", k)
		require.Len(t, r.res, 1, "cut at %d: a swallowed reply reached pgconn", k)
		assert.Equal(t, []string{"a", "b", "c"}, rows(r.res[0]), "cut at %d", k)
		assert.False(t, s.w.Failed())
	}
}

// cutWithKept runs a statement, cuts it with its context, and lets the drain end with msg
// (a message the drain keeps for pgconn) waiting for pgconn's next Read.
func (s *script) cutWithKept(msg pgproto3.BackendMessage) {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select pg_sleep(100)")
	require.Equal(s.t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(s.t, result(s.t, ch).firstErr())
	s.awaitCancel()
	s.send(msg, canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(s.t, s.waitClean())
}

// An interrupt that Interrupt consumes itself (pgconn wrote its next request and has not read
// yet) keeps what a drain kept for pgconn: the notification comes, then the synthetic end.
func TestScriptInterruptKeepsMessagesKeptByTheDrain(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.cutWithKept(&pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: "kept by the drain"})

	fe := s.pc.Frontend()
	fe.Send(&pgproto3.Query{String: "select 1"})
	require.NoError(t, fe.Flush())
	require.Equal(t, "select 1", s.expectQuery())
	s.w.Interrupt(errors.New("over budget"))

	var got []string
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	for {
		m, err := s.pc.ReceiveMessage(rctx)
		require.NoError(t, err)
		switch m := m.(type) {
		case *pgproto3.NotificationResponse:
			got = append(got, "notification "+m.Payload)
		case *pgproto3.ErrorResponse:
			got = append(got, "error "+m.Code)
		case *pgproto3.ReadyForQuery:
			got = append(got, "ready")
		default:
			got = append(got, fmt.Sprintf("%T", m))
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	require.Equal(t, []string{"notification kept by the drain", "error 57014", "ready"}, got)
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

// Read hands out what a drain kept in pieces as large as the reader's buffer. An interrupt that
// comes after the reader had the start of a kept message puts the synthetic end after the rest
// of that message, never in the middle of it.
func TestScriptInterruptAfterPartOfAKeptMessage(t *testing.T) {
	s := newScript(t, scriptOptions)
	notice := &pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: "kept by the drain for pgconn"}
	s.cutWithKept(notice)
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

	// The rest of the notice, then the synthetic ErrorResponse and ReadyForQuery.
	var got []byte
	buf := make([]byte, 7)
	for len(got) < len(want)-n+1 {
		m, err := s.w.Read(buf)
		require.NoError(t, err)
		got = append(got, buf[:m]...)
	}
	require.Equal(t, want[n:], got[:len(want)-n], "the rest of the notice was replaced by the synthetic end: a torn message")
	require.Equal(t, byte('E'), got[len(want)-n], "the synthetic end follows the notice")
}

// A FATAL that arrives in the same read as the end of the stream (a *tls.Conn returns the
// server's last bytes with io.EOF when its close_notify follows them), while an interrupt lands
// during that read, reaches pgconn: the caller gets the server's reason, as with pgx alone, not
// an EOF. The stream has ended, so no drain could follow anyway.
func TestScriptFatalWithEOFDuringInterruptedRead(t *testing.T) {
	s := newScript(t, scriptOptions)
	ch := s.exec(context.Background(), "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	s.cut.mu.Lock()
	s.cut.joinEOF = true
	s.cut.onRead = func() { s.w.Interrupt(context.Canceled) }
	s.cut.mu.Unlock()
	s.send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})
	_ = s.srv.Close()

	r := result(t, ch)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(r.firstErr(), &pgErr), "want the server's FATAL, got %v", r.firstErr())
	assert.Equal(t, "57P01", pgErr.Code)
	assert.Equal(t, "FATAL", pgErr.Severity)
	assert.True(t, s.pc.IsClosed())
	require.Error(t, s.waitClean())
}
