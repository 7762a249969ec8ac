package wire_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// memConn is an in-memory net.Conn for the fuzz targets: the server's bytes are queued as chunks
// (each Read returns at most one, so message boundaries fall anywhere), and the client's writes
// are recorded. Read honours a read deadline, as Interrupt and the drain need.
type memConn struct {
	mu       sync.Mutex
	cond     *sync.Cond
	chunks   [][]byte
	sent     bytes.Buffer
	deadline time.Time
	timer    *time.Timer
	closed   bool
	// respond, if set, is the server's answer to each write: chunks queued at once.
	respond func(b []byte) [][]byte
}

func newMemConn() *memConn {
	c := &memConn{}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *memConn) push(chunks ...[]byte) {
	c.mu.Lock()
	c.chunks = append(c.chunks, chunks...)
	c.cond.Broadcast()
	c.mu.Unlock()
}

// newFuzzConn returns a wire.Conn over a memConn, its cancel requests acknowledged at once. A hang
// is a failure: a watchdog closes the socket under every blocked call after 3 s.
func newFuzzConn(t testing.TB) (*memConn, *wire.Conn) {
	mc := newMemConn()
	w := wire.New(mc, wire.Options{ResetSQL: "RESET ALL", Grace: 5 * time.Second})
	w.SetCancel(func(context.Context) error { return nil })
	watchdog := time.AfterFunc(3*time.Second, func() { _ = mc.Close() })
	t.Cleanup(func() { watchdog.Stop() })
	return mc, w
}

// pushChunks queues stream in chunks of fuzzed sizes (the whole of it, a third of the time).
func (c *memConn) pushChunks(in *input, stream []byte) {
	for len(stream) > 0 {
		k := 1 + in.next(len(stream))
		if in.next(3) == 0 {
			k = len(stream)
		}
		c.push(stream[:k])
		stream = stream[k:]
	}
}

func (c *memConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return 0, net.ErrClosed
		}
		if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
			return 0, &net.OpError{Op: "read", Net: "mem", Err: os.ErrDeadlineExceeded}
		}
		if len(c.chunks) > 0 {
			n := copy(p, c.chunks[0])
			c.chunks[0] = c.chunks[0][n:]
			if len(c.chunks[0]) == 0 {
				c.chunks = c.chunks[1:]
			}
			return n, nil
		}
		c.cond.Wait()
	}
}

func (c *memConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	c.sent.Write(b)
	if c.respond != nil {
		if r := c.respond(b); len(r) > 0 {
			c.chunks = append(c.chunks, r...)
			c.cond.Broadcast()
		}
	}
	return len(b), nil
}

func (c *memConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	return nil
}

func (c *memConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

func (c *memConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	if c.timer != nil {
		c.timer.Stop()
	}
	if !t.IsZero() {
		c.timer = time.AfterFunc(time.Until(t), func() {
			c.mu.Lock()
			c.cond.Broadcast()
			c.mu.Unlock()
		})
	}
	c.cond.Broadcast()
	return nil
}

func (c *memConn) SetWriteDeadline(time.Time) error { return nil }
func (c *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// input hands out the fuzzer's bytes as small numbers.
type input struct{ b []byte }

func (in *input) next(n int) int {
	if len(in.b) == 0 || n <= 0 {
		return 0
	}
	v := int(in.b[0]) % n
	in.b = in.b[1:]
	return v
}

// encode encodes backend messages into one stream.
func encode(t testing.TB, msgs ...pgproto3.BackendMessage) []byte {
	t.Helper()
	var b []byte
	for _, m := range msgs {
		var err error
		b, err = m.Encode(b)
		require.NoError(t, err)
	}
	return b
}

// message is one backend message of a reply, and whether pgconn must see it whatever happens.
type message struct {
	raw   []byte
	async bool
}

// reply builds a fuzzed reply to one query: some of RowDescription, DataRow (some large), a
// notice, a notification, a ParameterStatus, an ERROR, then CommandComplete and ReadyForQuery.
func reply(t testing.TB, in *input, tag string) []message {
	var out []message
	n := in.next(6)
	for i := range n {
		var m pgproto3.BackendMessage
		async := false
		switch in.next(6) {
		case 0:
			m = &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}}
		case 1:
			size := 1 + in.next(64)
			if in.next(8) == 0 {
				size = 20 << 10 // larger than the read buffer
			}
			m = &pgproto3.DataRow{Values: [][]byte{bytes.Repeat([]byte{byte('a' + i)}, size)}}
		case 2:
			m = &pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: tag}
		case 3:
			m, async = &pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: fmt.Sprintf("%s-%d", tag, i)}, true
		case 4:
			m, async = &pgproto3.ParameterStatus{Name: "p", Value: fmt.Sprintf("%s-%d", tag, i)}, true
		default:
			m = &pgproto3.DataRow{Values: [][]byte{[]byte(tag)}}
		}
		out = append(out, message{raw: encode(t, m), async: async})
	}
	if in.next(4) == 0 {
		out = append(out, message{raw: encode(t, &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "22012", Message: tag})})
	} else {
		out = append(out, message{raw: encode(t, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})})
	}
	return append(out, message{raw: encode(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})})
}

// splitMessages frames a backend byte stream, failing on a torn message at its end.
func splitMessages(t testing.TB, b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		require.GreaterOrEqual(t, len(b), 5, "a torn header reached pgconn")
		size := 1 + int(binary.BigEndian.Uint32(b[1:5]))
		require.GreaterOrEqual(t, len(b), size, "a torn message reached pgconn")
		out = append(out, b[:size])
		b = b[size:]
	}
	return out
}

// FuzzInterrupt plays rounds of a staged SET (sometimes) and a query through a wire.Conn, the
// server's reply cut into chunks at fuzzed places, the client's query split across writes at a
// fuzzed place, its reads of fuzzed sizes, and an interrupt after a fuzzed number of bytes.
// Invariants: the client never sees a torn message; each of its requests gets exactly one
// ReadyForQuery; a staged query's reply never reaches it, nor does anything of a cut request
// after the cut but notifications, parameter changes and notices; nothing else is dropped; the
// drain ends with the Conn clean.
func FuzzInterrupt(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{1, 3, 0, 1, 2, 3, 4, 1, 7, 5, 2, 9, 200, 1, 1})
	f.Add([]byte{3, 5, 1, 1, 0, 2, 0, 4, 3, 1, 20, 30, 40, 2, 5, 0, 6, 1, 2, 3})
	f.Add(bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 20))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &input{b: data}
		mc, w := newFuzzConn(t)
		// Startup: bytes pass through until the first ReadyForQuery.
		mc.push(encode(t, &pgproto3.AuthenticationOk{}, &pgproto3.ReadyForQuery{TxStatus: 'I'}))
		got := readUntilReady(t, w, 1, 4096)
		require.Len(t, got, 2)

		rounds := 1 + in.next(4)
		for round := range rounds {
			tag := fmt.Sprintf("r%d", round)
			staged := in.next(2) == 0
			if staged {
				w.Stage("SET x = " + tag)
			}
			q, err := (&pgproto3.Query{String: "select " + tag}).Encode(nil)
			require.NoError(t, err)
			cut := in.next(len(q) + 1)
			sentBefore := mc.sentLen()
			if cut > 0 {
				_, err = w.Write(q[:cut])
				require.NoError(t, err)
			}
			if cut < len(q) {
				_, err = w.Write(q[cut:])
				require.NoError(t, err)
			}
			requests := mc.queries(t, sentBefore)
			if staged {
				require.Equal(t, []string{"SET x = " + tag, "select " + tag}, requests)
			} else {
				require.Equal(t, []string{"select " + tag}, requests)
			}

			// The server's replies, in fuzzed chunks.
			var stagedReply []message
			if staged {
				stagedReply = reply(t, in, "staged"+tag)
			}
			own := reply(t, in, tag)
			var stream []byte
			for _, m := range append(append([]message{}, stagedReply...), own...) {
				stream = append(stream, m.raw...)
			}
			mc.pushChunks(in, stream)

			// The client reads, with an interrupt after a fuzzed number of bytes.
			interruptAt := -1
			if in.next(2) == 0 {
				interruptAt = in.next(256)
			}
			// Reads of a fuzzed size, of pgconn's buffer's (8 KiB: wire then reads straight into
			// it), or of a few bytes, in a fuzzed order.
			readSize := 1 + in.next(512)
			sizes := [...]int{readSize, 8192, 1 + in.next(16)}
			buf := make([]byte, 8192)
			var p []byte
			var rcv []byte
			interrupted := false
			for {
				if interruptAt >= 0 && !interrupted && len(rcv) >= interruptAt {
					w.Interrupt(context.DeadlineExceeded)
					interrupted = true
				}
				p = buf[:sizes[in.next(len(sizes))]]
				n, err := w.Read(p)
				rcv = append(rcv, p[:n]...)
				require.NoError(t, err, "round %d staged %v interrupt at %d (%v) read %d", round, staged, interruptAt, interrupted, len(p))
				if hasReady(splitComplete(rcv)) {
					break
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			require.NoError(t, w.Wait(ctx))
			cancel()
			stagedErr := staged && stagedReply[len(stagedReply)-2].raw[0] == 'E'
			broken := w.Err()
			if stagedErr {
				require.True(t, w.Failed(), "a staged query failed unnoticed")
				if broken != nil {
					require.Contains(t, broken.Error(), "staged")
				}
			} else {
				require.NoError(t, broken)
				require.False(t, w.Failed())
			}
			w.ClearInterrupt()
			// What the drain kept for the client comes next; an interrupt with nothing in flight
			// then ends the read, as a socket deadline would.
			w.Interrupt(context.DeadlineExceeded)
			for {
				n, err := w.Read(p)
				rcv = append(rcv, p[:n]...)
				if err != nil {
					var ne net.Error
					require.True(t, errors.As(err, &ne) && ne.Timeout() || broken != nil, "%v", err)
					break
				}
			}
			w.ClearInterrupt()
			if broken == nil {
				require.Zero(t, w.Held(), "an idle connection holds a buffer")
			}
			checkRound(t, splitMessages(t, rcv), stagedReply, own)
			if stagedErr {
				return // the owner closes a session whose settings failed
			}
		}
	})
}

// readUntilReady reads from w until n ReadyForQuery messages, size bytes at a time.
func readUntilReady(t testing.TB, w *wire.Conn, n, size int) [][]byte {
	var rcv []byte
	p := make([]byte, size)
	for {
		k, err := w.Read(p)
		require.NoError(t, err)
		rcv = append(rcv, p[:k]...)
		msgs := splitComplete(rcv)
		ready := 0
		for _, m := range msgs {
			if m[0] == 'Z' {
				ready++
			}
		}
		if ready == n {
			return splitMessages(t, rcv)
		}
	}
}

// splitComplete frames the whole messages at the start of b.
func splitComplete(b []byte) [][]byte {
	var out [][]byte
	for len(b) >= 5 {
		size := 1 + int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < size {
			break
		}
		out = append(out, b[:size])
		b = b[size:]
	}
	return out
}

// checkRound checks what the client received in one round against what the server sent.
func checkRound(t testing.TB, msgs [][]byte, staged, own []message) {
	isAsync := func(m []byte) bool { return m[0] == 'A' || m[0] == 'S' }
	// Every notification and parameter change, of either reply, in order, wherever it fell.
	wantAsync, gotAsync := [][]byte{}, [][]byte{}
	for _, m := range append(append([]message{}, staged...), own...) {
		if m.async {
			wantAsync = append(wantAsync, m.raw)
		}
	}
	var rest [][]byte
	for _, m := range msgs {
		if isAsync(m) {
			gotAsync = append(gotAsync, m)
		} else {
			rest = append(rest, m)
		}
	}
	require.Equal(t, wantAsync, gotAsync, "a notification or parameter change was dropped or reordered")
	ready := 0
	for _, m := range rest {
		if m[0] == 'Z' {
			ready++
		}
	}
	require.Equal(t, 1, ready, "exactly one ReadyForQuery per request")
	// The own reply's other messages: a prefix as sent, then, if cut, the synthetic end and the
	// notices of the rest. Nothing of the staged reply.
	var ownSync [][]byte
	for _, m := range own {
		if !m.async {
			ownSync = append(ownSync, m.raw)
		}
	}
	j := 0
	for j < len(ownSync) && j < len(rest) && bytes.Equal(ownSync[j], rest[j]) {
		j++
	}
	if j == len(ownSync) {
		require.Equal(t, len(rest), j, "more than the reply")
		return
	}
	require.Less(t, j+1, len(rest), "a reply was cut without its synthetic end")
	require.Equal(t, byte('E'), rest[j][0])
	require.Contains(t, string(rest[j]), "57014")
	require.Equal(t, byte('Z'), rest[j+1][0])
	notices := [][]byte{}
	for _, m := range ownSync[j:] {
		if m[0] == 'N' {
			notices = append(notices, m)
		}
	}
	require.Equal(t, notices, rest[j+2:], "after the cut: the notices of the rest only")
}

func (c *memConn) sentLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent.Len()
}

// queries decodes the Query messages the client sent after offset from.
func (c *memConn) queries(t testing.TB, from int) []string {
	c.mu.Lock()
	b := append([]byte(nil), c.sent.Bytes()[from:]...)
	c.mu.Unlock()
	var out []string
	n := 0
	for _, m := range splitComplete(b) {
		require.Equal(t, byte('Q'), m[0], "the client's bytes do not frame")
		out = append(out, string(bytes.TrimSuffix(m[5:], []byte{0})))
		n += len(m)
	}
	require.Equal(t, len(b), n, "the client's bytes do not frame")
	return out
}

func hasReady(msgs [][]byte) bool {
	for _, m := range msgs {
		if m[0] == 'Z' {
			return true
		}
	}
	return false
}

// FuzzWriteFraming writes a fuzzed sequence of frontend messages in writes cut at fuzzed places,
// with settings staged between writes. Invariants: the server receives whole messages; without
// the staged queries it receives exactly what was written; a staged query goes only between two
// messages, never inside one nor inside an extended-protocol sequence before its Sync.
func FuzzWriteFraming(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{2, 3, 4, 5, 1, 1, 1, 0, 3, 3, 7, 200, 1, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &input{b: data}
		mc := newMemConn()
		w := wire.New(mc, wire.Options{ResetSQL: "SET staged reset", Grace: time.Second})
		mc.push(encode(t, &pgproto3.ReadyForQuery{TxStatus: 'I'}))
		p := make([]byte, 64)
		_, err := w.Read(p)
		require.NoError(t, err)

		var stream []byte
		for range 1 + in.next(12) {
			var m pgproto3.FrontendMessage
			switch in.next(8) {
			case 0:
				m = &pgproto3.Query{String: "select 1"}
			case 1:
				m = &pgproto3.Parse{Query: "select $1"}
			case 2:
				m = &pgproto3.Parse{Name: "s", Query: "select 2"}
			case 3:
				m = &pgproto3.Bind{}
			case 4:
				m = &pgproto3.Execute{}
			case 5:
				m = &pgproto3.Sync{}
			case 6:
				m = &pgproto3.Describe{ObjectType: 'P'}
			default:
				m = &pgproto3.Query{String: string(bytes.Repeat([]byte("x"), in.next(300)))}
			}
			stream, err = m.Encode(stream)
			require.NoError(t, err)
		}
		original := splitComplete(stream)
		rest := stream
		for len(rest) > 0 {
			if in.next(3) == 0 {
				w.Stage(fmt.Sprintf("SET staged %d", in.next(4)))
			}
			k := 1 + in.next(len(rest))
			if in.next(2) == 0 {
				k = len(rest)
			}
			n, err := w.Write(rest[:k])
			require.NoError(t, err)
			require.Equal(t, k, n)
			rest = rest[k:]
		}
		// The tracking is in step: a Sync ends any open sequence, and the settings staged now
		// go right before the next query.
		final, err := (&pgproto3.Sync{}).Encode(nil)
		require.NoError(t, err)
		original = append(original, final)
		_, err = w.Write(final)
		require.NoError(t, err)
		w.Stage("SET staged final")
		final, err = (&pgproto3.Query{String: "select 'final'"}).Encode(nil)
		require.NoError(t, err)
		original = append(original, final)
		_, err = w.Write(final)
		require.NoError(t, err)
		mc.mu.Lock()
		sent := append([]byte(nil), mc.sent.Bytes()...)
		mc.mu.Unlock()
		got := splitMessages(t, sent)
		var kept [][]byte
		ext := false
		for _, m := range got {
			if m[0] == 'Q' && bytes.HasPrefix(m[5:], []byte("SET staged")) {
				require.False(t, ext, "a staged query inside an extended-protocol sequence")
				continue
			}
			switch m[0] {
			case 'P', 'B', 'E', 'D':
				ext = true
			case 'S':
				ext = false
			}
			kept = append(kept, m)
		}
		require.Equal(t, original, kept)
		require.GreaterOrEqual(t, len(got), 2)
		require.Equal(t, "SET staged final", string(bytes.TrimSuffix(got[len(got)-2][5:], []byte{0})), "the tracking lost step")
	})
}
