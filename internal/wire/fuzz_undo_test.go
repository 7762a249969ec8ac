package wire_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
)

// FuzzCutPrepare plays a request of pgconn's that creates named statements (one to three Parses,
// each with a Describe, then a Sync), written in fuzzed pieces; its reply (each statement's
// ParseComplete, ParameterDescription and NoData, or an error part way) in fuzzed chunks; and an
// interrupt after a fuzzed number of bytes read. Invariants: the drain ends with the Conn clean,
// but when a write split a Parse before the end of its name (wire cannot know the statement, and
// breaks the Conn); after the request, the server receives a Close of every statement it created
// (those before the error) whose ParseComplete the client did not read, and a Sync, exactly when
// it was cut (the client read the synthetic 57014) and there are some, nothing otherwise; the
// next request goes through.
func FuzzCutPrepare(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{1, 0, 3, 0, 0, 1, 5, 9})
	f.Add([]byte{2, 1, 1, 40, 2, 7, 1, 3, 0, 12, 1, 1, 1})
	f.Add(bytes.Repeat([]byte{2, 5, 1, 0, 3}, 12))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &input{b: data}
		mc, w := newFuzzConn(t)
		mc.push(encode(t, &pgproto3.ReadyForQuery{TxStatus: 'I'}))
		readUntilReady(t, w, 1, 4096)

		// The request, written in fuzzed pieces.
		n := 1 + in.next(3)
		var names []string
		var req []byte
		var nameSpans [][2]int // where each Parse's name, with its NUL, lies in req
		for i := range n {
			name := fmt.Sprintf("stmtcache_%d_%s", i, bytes.Repeat([]byte{'x'}, in.next(40)))
			names = append(names, name)
			start := len(req)
			var err error
			req, err = (&pgproto3.Parse{Name: name, Query: "select 1"}).Encode(req)
			require.NoError(t, err)
			nameSpans = append(nameSpans, [2]int{start + 5, start + 5 + len(name) + 1})
			req, err = (&pgproto3.Describe{ObjectType: 'S', Name: name}).Encode(req)
			require.NoError(t, err)
		}
		req, err := (&pgproto3.Sync{}).Encode(req)
		require.NoError(t, err)
		splitName := false
		for rest, at := req, 0; len(rest) > 0; {
			k := len(rest)
			if in.next(3) == 0 {
				k = 1 + in.next(len(rest))
			}
			_, err := w.Write(rest[:k])
			require.NoError(t, err)
			at += k
			for _, s := range nameSpans {
				if at >= s[0] && at < s[1] {
					splitName = true
				}
			}
			rest = rest[k:]
		}
		sentBefore := mc.sentLen()
		// The server answers the drain's Close request when it arrives (from now on: a piece of
		// the request may start with a 'C').
		respond := func(b []byte) [][]byte {
			if len(b) == 0 || b[0] != 'C' {
				return nil
			}
			var msgs []pgproto3.BackendMessage
			for _, m := range splitComplete(b) {
				if m[0] == 'C' {
					msgs = append(msgs, &pgproto3.CloseComplete{})
				}
			}
			msgs = append(msgs, &pgproto3.ReadyForQuery{TxStatus: 'I'})
			return [][]byte{encode(t, msgs...)}
		}
		mc.mu.Lock()
		mc.respond = respond
		mc.mu.Unlock()

		// The reply, in fuzzed chunks: each statement's, or an error at a fuzzed one.
		failAt := -1
		if in.next(4) == 0 {
			failAt = in.next(n)
		}
		var msgs []pgproto3.BackendMessage
		for i := range n {
			if i == failAt {
				msgs = append(msgs, &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "42601", Message: "syntax"})
				break
			}
			msgs = append(msgs, &pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{}, &pgproto3.NoData{})
		}
		msgs = append(msgs, &pgproto3.ReadyForQuery{TxStatus: 'I'})
		mc.pushChunks(in, encode(t, msgs...))

		// The client reads, with an interrupt after a fuzzed number of bytes.
		interruptAt := -1
		if in.next(2) == 0 {
			interruptAt = in.next(64)
		}
		p := make([]byte, 1+in.next(64))
		var rcv []byte
		interrupted := false
		for !hasReady(splitComplete(rcv)) {
			if interruptAt >= 0 && !interrupted && len(rcv) >= interruptAt {
				w.Interrupt(context.DeadlineExceeded)
				interrupted = true
			}
			k, err := w.Read(p)
			require.NoError(t, err)
			rcv = append(rcv, p[:k]...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		require.NoError(t, w.Wait(ctx))
		cancel()
		w.ClearInterrupt()
		cut := bytes.Contains(rcv, []byte("57014"))
		t.Logf("DBG cut %v split %v interrupted %v at %d rcv %q sent %q", cut, splitName, interrupted, interruptAt, rcv, mc.sent.Bytes())
		if cut && splitName {
			if err := w.Err(); err != nil {
				require.Contains(t, err.Error(), "named prepared statement")
				return
			}
		}
		require.NoError(t, w.Err())

		mc.mu.Lock()
		after := append([]byte(nil), mc.sent.Bytes()[sentBefore:]...)
		mc.mu.Unlock()
		// The statements the server created (those before the error) whose ParseComplete the
		// client did not read.
		created := names
		if failAt >= 0 {
			created = names[:failAt]
		}
		seen := 0
		for _, m := range splitComplete(rcv) {
			if m[0] == '1' {
				seen++
			}
		}
		created = created[min(seen, len(created)):]
		if !cut || len(created) == 0 {
			require.Empty(t, after, "no Close: the request was answered in full, or created nothing")
		} else {
			got := splitMessages(t, after)
			require.Len(t, got, len(created)+1)
			for i, name := range created {
				var c pgproto3.Close
				require.Equal(t, byte('C'), got[i][0])
				require.NoError(t, c.Decode(got[i][5:]))
				require.Equal(t, byte('S'), c.ObjectType)
				require.Equal(t, name, c.Name)
			}
			require.Equal(t, byte('S'), got[len(created)][0])
		}

		// The next request goes through.
		q, err := (&pgproto3.Query{String: "select 1"}).Encode(nil)
		require.NoError(t, err)
		_, err = w.Write(q)
		require.NoError(t, err)
		mc.push(encode(t, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'}))
		got := readUntilReady(t, w, 1, 4096)
		require.Equal(t, byte('C'), got[0][0])
	})
}
