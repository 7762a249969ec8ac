package wire_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
)

// A request cut before pgconn read the ParseComplete of the named statements the server then
// created: the drain closes them, in one request of its own, before the Conn is ready again.

// prepare runs pgconn's Prepare of name in the background; the server reads its Parse,
// Describe and Sync.
func (s *script) prepare(ctx context.Context, name, sql string) <-chan execResult {
	s.t.Helper()
	ch := make(chan execResult, 1)
	go func() {
		_, err := s.pc.Prepare(ctx, name, sql, nil)
		ch <- execResult{err: err}
	}()
	p, ok := s.recv().(*pgproto3.Parse)
	require.True(s.t, ok, "want a Parse")
	require.Equal(s.t, name, p.Name)
	_, ok = s.recv().(*pgproto3.Describe)
	require.True(s.t, ok, "want a Describe")
	_, ok = s.recv().(*pgproto3.Sync)
	require.True(s.t, ok, "want a Sync")
	return ch
}

// expectClose reads the drain's Close of each name and its Sync.
func (s *script) expectClose(names ...string) {
	s.t.Helper()
	for _, n := range names {
		m := s.recv()
		c, ok := m.(*pgproto3.Close)
		require.True(s.t, ok, "want a Close, got %T %+v", m, m)
		require.Equal(s.t, byte('S'), c.ObjectType)
		require.Equal(s.t, n, c.Name)
	}
	m := s.recv()
	_, ok := m.(*pgproto3.Sync)
	require.True(s.t, ok, "want a Sync, got %T", m)
}

// cutPrepare cuts a Prepare of name, then the server creates the statement (its ParseComplete,
// read by the drain only) and answers the cancel, in a session whose transaction status is tx.
func (s *script) cutPrepare(name string, tx byte) {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.prepare(ctx, name, "select 1")
	cancel()
	requireCanceled(s.t, result(s.t, ch).err)
	s.awaitCancel()
	s.send(&pgproto3.ParseComplete{}, canceled(), &pgproto3.ReadyForQuery{TxStatus: tx})
}

func TestScriptCutPrepareIsClosed(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.cutPrepare("stmtcache_1", 'I')
	s.expectClose("stmtcache_1")
	s.send(&pgproto3.CloseComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

// In a transaction that the cut aborted, the Close is sent as well (PostgreSQL takes a Close
// message in a failed transaction block), and the Conn is kept: pgconn was told 'E'.
func TestScriptCutPrepareInAbortedTransactionIsClosed(t *testing.T) {
	s := newScript(t, scriptOptions)
	ch := s.exec(context.Background(), "begin")
	require.Equal(t, "begin", s.expectQuery())
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
	require.NoError(t, result(t, ch).firstErr())
	s.cutPrepare("stmtcache_2", 'E')
	s.expectClose("stmtcache_2")
	s.send(&pgproto3.CloseComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'E'})
	require.NoError(t, s.waitClean())
	require.Equal(t, byte('E'), s.pc.TxStatus())
}

// Several named Parses in one cut request (a batch's prepares): all closed, in one request.
func TestScriptCutPipelineClosesEveryStatement(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		pl := s.pc.StartPipeline(ctx)
		pl.SendPrepare("a", "select 1", nil)
		pl.SendPrepare("b", "select 2", nil)
		err := pl.Sync()
		for err == nil {
			_, err = pl.GetResults()
		}
		_ = pl.Close()
		done <- err
	}()
	for _, want := range []string{"a", "b"} {
		p, ok := s.recv().(*pgproto3.Parse)
		require.True(t, ok)
		require.Equal(t, want, p.Name)
		_, ok = s.recv().(*pgproto3.Describe)
		require.True(t, ok)
	}
	_, ok := s.recv().(*pgproto3.Sync)
	require.True(t, ok)
	cancel()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline did not return")
	}
	s.awaitCancel()
	s.send(&pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{}, &pgproto3.NoData{}, &pgproto3.ParseComplete{},
		canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	s.expectClose("a", "b")
	s.send(&pgproto3.CloseComplete{}, &pgproto3.CloseComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

// A Close the server refuses leaves the session unknown: the Conn breaks.
func TestScriptCutPrepareCloseRefusedBreaks(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.cutPrepare("stmtcache_3", 'I')
	s.expectClose("stmtcache_3")
	s.send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "XX000", Message: "no"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.Error(t, s.waitClean())
	require.True(t, s.w.Broken())
}

// A Close the server does not answer within the grace breaks the Conn.
func TestScriptCutPrepareCloseUnansweredBreaks(t *testing.T) {
	opts := scriptOptions
	opts.Grace = 300 * time.Millisecond
	s := newScript(t, opts)
	s.cutPrepare("stmtcache_4", 'I')
	s.expectClose("stmtcache_4")
	require.Error(t, s.waitClean())
	require.True(t, s.w.Broken())
}

// A request that only names statements it does not create (Bind and Execute of a prepared one)
// needs no Close.
func TestScriptCutExecuteOfPreparedClosesNothing(t *testing.T) {
	s := newScript(t, scriptOptions)
	ch := s.prepare(context.Background(), "p", "select 1")
	s.send(&pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{}, &pgproto3.NoData{}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, result(t, ch).err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.pc.ExecPrepared(ctx, "p", nil, nil, nil).Close()
		done <- err
	}()
	for range 4 { // Bind, Describe portal, Execute, Sync
		s.recv()
	}
	cancel()
	select {
	case err := <-done:
		requireCanceled(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not return")
	}
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip() // the next message is the round trip's Query, not a Close
}

// A Prepare cut before the server created the statement (its Parse refused: the name is taken,
// by a statement pgx may know) gets no Close: the next message is the round trip's Query.
func TestScriptCutPrepareRefusedClosesNothing(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.prepare(ctx, "taken", "select 1")
	cancel()
	requireCanceled(t, result(t, ch).err)
	s.awaitCancel()
	s.send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "42P05", Message: `prepared statement "taken" already exists`},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

// A cut request whose reply comes within Options.ReplyWait needs no cancel request: the drain
// reads the reply and the Conn is clean, no cancel sent. One whose reply does not come gets
// its cancel after ReplyWait.
func TestScriptCutReplyWithinReplyWaitSendsNoCancel(t *testing.T) {
	opts := scriptOptions
	opts.ReplyWait = 10 * time.Second // longer than the test: the reply always comes first
	s := newScript(t, opts)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select 1")
	require.Equal(t, "select 1", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	select { // a drain that does not wait sends its cancel at once
	case <-s.cancel:
		t.Fatal("a cancel request before the reply could come")
	case <-time.After(50 * time.Millisecond):
	}
	s.answer('I', "1")
	require.NoError(t, s.waitClean())
	s.mu.Lock()
	require.Zero(t, s.cancels, "a cancel request for a request whose reply came")
	s.mu.Unlock()
	s.roundTrip()

	s = newScript(t, scriptOptions) // the default, 2 ms
	ctx, cancel = context.WithCancel(context.Background())
	ch = s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
}

// recvWithin returns the next frontend message, or nil if none comes within d.
func (s *script) recvWithin(d time.Duration) pgproto3.FrontendMessage {
	_ = s.srv.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = s.srv.SetReadDeadline(time.Time{}) }()
	m, err := s.be.Receive()
	if err != nil {
		return nil
	}
	return m
}

// A raw pipeline's caller handed the description of statement "a" (the server flushed its
// ParseComplete, ParameterDescription and NoData) before the rest of the request was cut holds
// "a", which PostgreSQL keeps: the drain does not close it, and the Conn is kept.
func TestScriptDeliveredStatementIsKept(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan any, 4)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		pl := s.pc.StartPipeline(ctx)
		pl.SendPrepare("a", "select 1", nil)
		pl.SendQueryParams("select pg_sleep(10)", nil, nil, nil, nil)
		err := pl.Sync()
		for err == nil {
			var r any
			r, err = pl.GetResults()
			if rr, ok := r.(*pgconn.ResultReader); ok {
				_, err = rr.Close()
			}
			got <- r
		}
		_ = pl.Close()
		got <- err
	}()
	for range 6 { // Parse, Describe, Parse, Bind, Describe, Execute
		s.recv()
	}
	_, ok := s.recv().(*pgproto3.Sync)
	require.True(t, ok)
	s.send(&pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{}, &pgproto3.NoData{})
	first := <-got
	_, ok = first.(*pgconn.StatementDescription)
	require.True(t, ok, "got %T", first)
	cancel()
	s.awaitCancel()
	s.send(&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	select {
	case <-ended: // the pipeline is closed: pgconn is free
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline did not end")
	}
	s.roundTrip() // the next message is the round trip's Query, not a Close
}

// cutCopy starts a CopyFrom whose source blocks, cuts it, and lets pgconn return; with
// sendCopyIn, pgconn had the CopyInResponse first.
func (s *script) cutCopy(sendCopyIn bool) {
	s.t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.pc.CopyFrom(ctx, pr, "copy t from stdin")
		done <- err
	}()
	require.Equal(s.t, "copy t from stdin", s.expectQuery())
	if sendCopyIn {
		s.send(&pgproto3.CopyInResponse{})
		time.Sleep(50 * time.Millisecond) // pgconn reads it
	}
	cancel()
	require.Eventually(s.t, s.w.Draining, time.Second, time.Millisecond)
	_ = pw.Close()
	select {
	case err := <-done:
		requireCanceled(s.t, err)
	case <-time.After(5 * time.Second):
		s.t.Fatal("CopyFrom did not return")
	}
}

// The drain of a cut COPY FROM STDIN sends its CopyFail at once, with a ReplyWait longer than the
// test (the server cannot answer before it); and, without cancel requests, also when the
// CopyInResponse reaches the drain late (it read until its deadline, and the Conn broke).
func TestScriptCutCopyGetsItsCopyFail(t *testing.T) {
	copyFailed := func(s *script) {
		t.Helper()
		m := s.recvWithin(time.Second)
		_, ok := m.(*pgproto3.CopyFail)
		require.True(t, ok, "want the CopyFail within 1 s, got %T", m)
		s.send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014", Message: "COPY from stdin failed"},
			&pgproto3.ReadyForQuery{TxStatus: 'I'})
		require.NoError(t, s.waitClean())
	}
	t.Run("ReplyWait", func(t *testing.T) {
		opts := scriptOptions
		opts.ReplyWait = 10 * time.Second
		s := newScript(t, opts)
		s.cutCopy(true)
		copyFailed(s)
	})
	t.Run("NoCancel, late CopyInResponse", func(t *testing.T) {
		opts := scriptOptions
		opts.NoCancel = true
		opts.Grace = 3 * time.Second
		s := newScript(t, opts)
		s.cutCopy(false)
		time.Sleep(100 * time.Millisecond) // past ReplyWait's 2 ms
		s.send(&pgproto3.CopyInResponse{})
		copyFailed(s)
	})
}

// Inside a transaction block there is no ReplyWait: pgconn was told the transaction is aborted
// ('E'), and a statement that ended by itself meanwhile would leave it 'T'. The cancel comes at
// once, with a ReplyWait longer than the test.
func TestScriptCutInTransactionCancelsAtOnce(t *testing.T) {
	opts := scriptOptions
	opts.ReplyWait = 10 * time.Second
	s := newScript(t, opts)
	ch := s.exec(context.Background(), "begin")
	require.Equal(t, "begin", s.expectQuery())
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
	require.NoError(t, result(t, ch).firstErr())
	ctx, cancel := context.WithCancel(context.Background())
	ch = s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	select {
	case <-s.cancel:
	case <-time.After(2 * time.Second):
		t.Fatal("no cancel request within 2 s: the drain waited for the reply")
	}
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'E'})
	require.NoError(t, s.waitClean())
}
