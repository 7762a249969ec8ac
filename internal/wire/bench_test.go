package wire_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

// A staged SET goes in the same write as the query; its reply is dropped; asynchronous messages
// (ParameterStatus, a notification, a notice of the query) reach pgconn wherever they fall.
func TestScriptStagedAndAsynchronous(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.w.Stage("SET statement_timeout = 5000")
	ch := s.exec(context.Background(), "select 1")
	require.Equal(t, "SET statement_timeout = 5000", s.expectQuery())
	require.Equal(t, "select 1", s.expectQuery())
	s.send(
		&pgproto3.ParameterStatus{Name: "statement_timeout", Value: "5s"},
		&pgproto3.CommandComplete{CommandTag: []byte("SET")},
		&pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: "during the staged reply"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
		&pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "the query's notice"},
	)
	s.answer('I', "1")
	r := result(t, ch)
	require.NoError(t, r.firstErr())
	require.Len(t, r.res, 1, "the SET's result never reaches pgconn")
	assert.Equal(t, []string{"1"}, rows(r.res[0]))
	assert.Equal(t, "5s", s.pc.ParameterStatus("statement_timeout"))
	assert.False(t, s.w.Failed())
	s.mu.Lock()
	require.Len(t, s.notices, 1)
	assert.Equal(t, "the query's notice", s.notices[0].Message)
	s.mu.Unlock()

	// The same settings again: nothing staged.
	s.w.Stage("SET statement_timeout = 5000")
	s.roundTrip()
}

// Case 1 of issue 19: a call whose ctx ends while its write waits for a drain returns at once,
// its request is never sent, and the session is kept once the drain ends.
func TestScriptDeadlineWhileWaitingForDrain(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := newScript(t, scriptOptions)

	ctx1, cancel1 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel1()
	first := s.exec(ctx1, "select pg_sleep(1)")
	require.Equal(t, "select pg_sleep(1)", s.expectQuery())
	r := result(t, first)
	requireCanceled(t, r.firstErr())
	s.awaitCancel() // the server does not obey yet: the drain goes on

	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	second := s.exec(ctx2, "select pg_sleep(2)")
	r = result(t, second)
	requireCanceled(t, r.firstErr())
	assert.Less(t, r.took, time.Second, "the second deadline was lost in the drain")
	assert.ErrorIs(t, s.w.Cause(), context.DeadlineExceeded)
	assert.True(t, s.w.Draining())

	// The server obeys the cancel: the first statement ends; the second was never sent.
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

// The same while the first statement is slow to obey and the second call has no deadline: it
// waits for the drain, then runs.
func TestScriptWriteWaitsForDrainWithoutDeadline(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx1, cancel1 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel1()
	requireCanceled(t, result(t, s.exec(ctx1, "select pg_sleep(1)")).firstErr())
	require.Equal(t, "select pg_sleep(1)", s.expectQuery())
	s.awaitCancel()

	second := s.exec(context.Background(), "select 2")
	s.silent(100 * time.Millisecond) // it waits: the first statement still runs
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.Equal(t, "select 2", s.expectQuery())
	s.answer('I', "2")
	r := result(t, second)
	require.NoError(t, r.firstErr())
	assert.Equal(t, []string{"2"}, rows(r.res[0]))
}

// Issue 19, 5: a cancel that lands on a staged SET makes the session's settings unknown: the
// Conn breaks, and Failed reports it.
func TestScriptStagedQueryFailsDuringDrain(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.w.Stage("SET statement_timeout = 5000")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ch := s.exec(ctx, "select pg_sleep(1)")
	require.Equal(t, "SET statement_timeout = 5000", s.expectQuery())
	require.Equal(t, "select pg_sleep(1)", s.expectQuery())
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	// The cancel hit the SET; the query then ran to its end.
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	s.answer('I', "")
	err := s.waitClean()
	require.Error(t, err, "a staged query failed, yet the Conn is clean")
	assert.Contains(t, err.Error(), "staged")
	assert.True(t, s.w.Failed())
}

// A staged query's error outside a drain is dropped too, and reported by Failed.
func TestScriptStagedQueryFails(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.w.Stage("SET nonsense = 1")
	ch := s.exec(context.Background(), "select 1")
	s.expectQuery()
	s.expectQuery()
	s.send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42704", Message: "unrecognized configuration parameter"}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	s.answer('I', "1")
	r := result(t, ch)
	require.NoError(t, r.firstErr(), "the staged query's error reached pgconn")
	assert.True(t, s.w.Failed())
}

// Issue 19, 5: a notice and a FATAL that arrive during a drain reach pgconn: the next call gets
// the server's reason, not an EOF.
func TestScriptNoticeAndFatalDuringDrain(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ch := s.exec(ctx, "select pg_sleep(10)")
	s.expectQuery()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	s.send(
		&pgproto3.NoticeResponse{Severity: "WARNING", Code: "01000", Message: "a notice of the cut statement"},
		&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"},
	)
	_ = s.srv.Close()
	require.Error(t, s.waitClean())

	_, err := s.pc.Exec(context.Background(), "select 1").ReadAll()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want the server's FATAL, got %v", err)
	assert.Equal(t, "57P01", pgErr.Code)
	assert.Equal(t, "FATAL", pgErr.Severity)
	assert.True(t, s.pc.IsClosed())
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.notices, 1)
	assert.Equal(t, "a notice of the cut statement", s.notices[0].Message)
}

// A FATAL in the middle of a request reaches pgconn as the server sent it.
func TestScriptFatalMidRequest(t *testing.T) {
	s := newScript(t, scriptOptions)
	ch := s.exec(context.Background(), "select * from t")
	s.expectQuery()
	s.send(
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("x")}},
		&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"},
	)
	_ = s.srv.Close()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(result(t, ch).firstErr(), &pgErr))
	assert.Equal(t, "57P01", pgErr.Code)
}

// Issue 19, 5: a header split across writes is tracked: the staged query goes before the next
// request, not inside a message.
func TestScriptHeaderSplitAcrossWrites(t *testing.T) {
	s := newScript(t, scriptOptions)
	q := (&pgproto3.Query{String: "select 'split'"})
	msg, err := q.Encode(nil)
	require.NoError(t, err)
	for _, cut := range []int{1, 2, 4, 5, 6} {
		s.w.Stage("")
		_, err = s.w.Write(msg[:cut])
		require.NoError(t, err)
		s.w.Stage("SET a.b = " + string(rune('0'+cut)))
		_, err = s.w.Write(msg[cut:])
		require.NoError(t, err)
		require.Equal(t, "select 'split'", s.expectQuery(), "cut at %d", cut)
		s.answer('I', "split")
		drainRaw(t, s.w, 1)
	}
	// The staged SET goes before the next whole request.
	s.roundTripRaw(t, "SET a.b = 6")
}

// drainRaw reads from w, as pgconn would, until n ReadyForQuery messages.
func drainRaw(t *testing.T, w *wire.Conn, n int) []pgproto3.BackendMessage {
	t.Helper()
	fe := pgproto3.NewFrontend(w, io.Discard)
	var got []pgproto3.BackendMessage
	_ = w.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = w.SetReadDeadline(time.Time{}) }()
	for n > 0 {
		m, err := fe.Receive()
		require.NoError(t, err)
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			n--
		}
		got = append(got, m)
	}
	return got
}

// roundTripRaw sends a query through w directly and expects staged before it.
func (s *script) roundTripRaw(t *testing.T, staged string) {
	msg, err := (&pgproto3.Query{String: "select 'raw'"}).Encode(nil)
	require.NoError(t, err)
	_, err = s.w.Write(msg)
	require.NoError(t, err)
	require.Equal(t, staged, s.expectQuery())
	require.Equal(t, "select 'raw'", s.expectQuery())
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("SET")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	s.answer('I', "raw")
	got := drainRaw(t, s.w, 1)
	require.Len(t, got, 4, "RowDescription, DataRow, CommandComplete, ReadyForQuery: the SET's reply is dropped")
}

// Headers and bodies split across reads, one byte at a time, and a message over 256 KiB, reach
// pgconn whole.
func TestScriptSplitReadsAndLargeMessages(t *testing.T) {
	s := newScript(t, scriptOptions)
	ch := s.exec(context.Background(), "select big")
	s.expectQuery()
	big := strings.Repeat("x", 300<<10)
	var b []byte
	for _, m := range []pgproto3.BackendMessage{
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("small")}},
		&pgproto3.DataRow{Values: [][]byte{[]byte(big)}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 2")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	} {
		var err error
		b, err = m.Encode(b)
		require.NoError(t, err)
	}
	go func() {
		for i := 0; i < 64; i++ { // the first bytes one at a time: headers split across reads
			_, _ = s.srv.Write(b[i : i+1])
		}
		_, _ = s.srv.Write(b[64:])
	}()
	r := result(t, ch)
	require.NoError(t, r.firstErr())
	assert.Equal(t, []string{"small", big}, rows(r.res[0]))
	s.roundTrip()
}

// An interrupt in the middle of a message over 256 KiB that pgconn has begun breaks the Conn.
func TestScriptInterruptInsideLargeMessageBreaks(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select big")
	s.expectQuery()
	msg, err := (&pgproto3.DataRow{Values: [][]byte{bytes.Repeat([]byte("y"), 300<<10)}}).Encode(nil)
	require.NoError(t, err)
	head, err := (&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}}).Encode(nil)
	require.NoError(t, err)
	s.sendRaw(append(head, msg[:200<<10]...))
	time.Sleep(50 * time.Millisecond) // let pgconn take the first part
	cancel()
	r := result(t, ch)
	require.Error(t, r.firstErr())
	assert.True(t, s.w.Broken())
}

// Issue 19, 6: an interrupt at every message boundary of a reply: pgconn gets the messages before
// it whole and a synthetic end after, and the session is kept once the server's rest is drained.
func TestScriptInterruptAtEveryBoundary(t *testing.T) {
	reply := []pgproto3.BackendMessage{
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("a")}},
		&pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "n"},
		&pgproto3.DataRow{Values: [][]byte{[]byte("b")}},
		&pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: "p"},
		&pgproto3.DataRow{Values: [][]byte{[]byte("c")}},
	}
	for at := 0; at <= len(reply); at++ {
		s := newScript(t, scriptOptions)
		ctx, cancel := context.WithCancel(context.Background())
		ch := s.exec(ctx, "select v")
		s.expectQuery()
		s.send(reply[:at]...)
		time.Sleep(10 * time.Millisecond)
		cancel()
		r := result(t, ch)
		requireCanceled(t, r.firstErr())
		s.awaitCancel()
		s.send(reply[at:]...)
		s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
		require.NoError(t, s.waitClean(), "interrupt after %d messages", at)
		s.roundTrip()
	}
}

// The extended protocol: an interrupt during an Exec of prepared statement parameters.
func TestScriptExtendedInterrupted(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ch := make(chan error, 1)
	go func() {
		ch <- s.pc.ExecParams(ctx, "select pg_sleep($1)", [][]byte{[]byte("1")}, nil, nil, nil).Read().Err
	}()
	for _, want := range []string{"*pgproto3.Parse", "*pgproto3.Bind", "*pgproto3.Describe", "*pgproto3.Execute", "*pgproto3.Sync"} {
		m := s.recv()
		require.Equal(t, want, typeName(m))
	}
	s.send(&pgproto3.ParseComplete{}, &pgproto3.BindComplete{})
	select {
	case err := <-ch:
		requireCanceled(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("ExecParams did not return")
	}
	s.awaitCancel()
	s.send(&pgproto3.RowDescription{}, canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

func typeName(m any) string { return fmt.Sprintf("%T", m) }

// Issue 19, 3: a pipeline with several Syncs in flight: the interrupt closes the connection, and
// the error is one pgconn.Timeout and errors.Is(err, ctx.Err()) recognise, as pgxpool's.
func TestScriptPipelineSeveralSyncs(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p := s.pc.StartPipeline(ctx)
	p.SendQueryParams("select pg_sleep(1)", nil, nil, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams("select 2", nil, nil, nil, nil)
	p.SendPipelineSync()
	require.NoError(t, p.Flush())
	start := time.Now()
	var err error
	for err == nil {
		var res any
		res, err = p.GetResults()
		if rr, ok := res.(*pgconn.ResultReader); ok {
			_, err = rr.Close()
		}
		if res == nil && err == nil {
			break
		}
	}
	took := time.Since(start)
	require.Error(t, err)
	assert.True(t, pgconn.Timeout(err), "%v", err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, took, time.Second)
	_ = p.Close()
	assert.True(t, s.pc.IsClosed())
}

// A pipeline with one Sync in flight (pgx's batches) keeps the connection.
func TestScriptPipelineOneSync(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p := s.pc.StartPipeline(ctx)
	p.SendQueryParams("select pg_sleep(1)", nil, nil, nil, nil)
	p.SendQueryParams("select 2", nil, nil, nil, nil)
	p.SendPipelineSync()
	require.NoError(t, p.Flush())
	s.untilSync()
	res, err := p.GetResults()
	if rr, ok := res.(*pgconn.ResultReader); ok {
		_, err = rr.Close()
	}
	requireCanceled(t, err)
	for {
		res, err = p.GetResults()
		if _, ok := res.(*pgconn.PipelineSync); ok || err != nil || res == nil {
			break
		}
	}
	require.NoError(t, err)
	require.NoError(t, p.Close())
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

// Issue 19, 2: a COPY FROM STDIN whose source stalls: the deadline ends it, the drain sends a
// CopyFail at once (the server acts on a cancel only when data arrives), pgconn's CopyDone is
// dropped, and the session is kept.
func TestScriptCopyInStalledSource(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	src, feed := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := s.pc.CopyFrom(ctx, src, "copy t from stdin")
		done <- err
	}()
	require.Equal(t, "copy t from stdin", s.expectQuery())
	s.send(&pgproto3.CopyInResponse{})
	go func() { _, _ = feed.Write([]byte("1\n2\n")) }()
	_, ok := s.recv().(*pgproto3.CopyData)
	require.True(t, ok)
	// The source stalls; the deadline passes; wire ends the COPY itself.
	m := s.recv()
	cf, ok := m.(*pgproto3.CopyFail)
	require.True(t, ok, "want a CopyFail, got %T", m)
	assert.Contains(t, cf.Message, "context")
	s.send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "57014", Message: "COPY from stdin failed"}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	_ = feed.Close() // the source returns; pgconn ends its copy, which is dropped
	select {
	case err := <-done:
		requireCanceled(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("CopyFrom did not return")
	}
	s.roundTrip()
}

// COPY TO STDOUT cut in the middle of its data: the rest is drained.
func TestScriptCopyOutInterrupted(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.pc.CopyTo(ctx, io.Discard, "copy t to stdout")
		done <- err
	}()
	s.expectQuery()
	s.send(&pgproto3.CopyOutResponse{}, &pgproto3.CopyData{Data: []byte("1\n")})
	time.Sleep(10 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		requireCanceled(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("CopyTo did not return")
	}
	s.awaitCancel()
	s.send(&pgproto3.CopyData{Data: []byte("2\n")}, canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	s.roundTrip()
}

// A read with nothing in flight (WaitForNotification) during a drain ends with the ctx, and a
// notification is delivered.
func TestScriptNotificationDuringDrain(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	requireCanceled(t, result(t, s.exec(ctx, "select pg_sleep(1)")).firstErr())
	s.expectQuery()
	s.awaitCancel()

	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	start := time.Now()
	err := s.pc.WaitForNotification(ctx2)
	require.Error(t, err)
	assert.True(t, pgconn.Timeout(err), "%v", err)
	assert.Less(t, time.Since(start), time.Second)
	assert.False(t, s.pc.IsClosed())

	s.send(&pgproto3.NotificationResponse{PID: 9, Channel: "c", Payload: "late"}, canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, s.waitClean())
	ctx3, cancel3 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel3()
	require.NoError(t, s.pc.WaitForNotification(ctx3))
}

// A server that never answers the drain: the Conn breaks after Grace, and the caller was back at
// once.
func TestScriptSilentServerBreaksAfterGrace(t *testing.T) {
	opts := scriptOptions
	opts.Grace = 200 * time.Millisecond
	s := newScript(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	requireCanceled(t, result(t, s.exec(ctx, "select pg_sleep(1)")).firstErr())
	s.expectQuery()
	require.Error(t, s.waitClean())
}

// untilSync reads frontend messages up to a Sync.
func (s *script) untilSync() {
	s.t.Helper()
	for {
		if _, ok := s.recv().(*pgproto3.Sync); ok {
			return
		}
	}
}

// A request never sent because its ctx ended while it waited for a drain: a named Parse in it
// leaves the server and pgx in step (neither has the statement), so the session is kept; a Close
// in it is one pgx may believe done while the server still has the statement, so the Conn breaks.
func TestScriptDroppedPrepareAndClose(t *testing.T) {
	for _, tc := range []struct {
		name  string
		call  func(ctx context.Context, pc *pgconn.PgConn) error
		clean bool
	}{
		{"named Parse", func(ctx context.Context, pc *pgconn.PgConn) error {
			_, err := pc.Prepare(ctx, "named", "select 1", nil)
			return err
		}, true},
		{"Close", func(ctx context.Context, pc *pgconn.PgConn) error { return pc.Deallocate(ctx, "named") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(t, scriptOptions)
			ctx1, cancel1 := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel1()
			requireCanceled(t, result(t, s.exec(ctx1, "select pg_sleep(1)")).firstErr())
			s.expectQuery()
			s.awaitCancel()
			ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel2()
			requireCanceled(t, tc.call(ctx2, s.pc))
			s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'})
			err := s.waitClean()
			if tc.clean {
				require.NoError(t, err)
				s.roundTrip()
			} else {
				require.Error(t, err)
			}
		})
	}
}

// Options.Ready: a Conn wrapped after authentication tracks requests from the start: staged
// settings go before the first request, and an interrupt ends it.
func TestReadyWrapsAfterAuthentication(t *testing.T) {
	mc := newMemConn()
	w := wire.New(mc, wire.Options{ResetSQL: "RESET ALL", Grace: time.Second, Ready: true})
	w.SetCancel(func(context.Context) error { return nil })
	w.Stage("SET a = 1")
	q, err := (&pgproto3.Query{String: "select 1"}).Encode(nil)
	require.NoError(t, err)
	_, err = w.Write(q)
	require.NoError(t, err)
	require.Equal(t, []string{"SET a = 1", "select 1"}, mc.queries(t, 0))
	w.Interrupt(context.DeadlineExceeded)
	got := readUntilReady(t, w, 1, 4096)
	require.Len(t, got, 2)
	assert.Contains(t, string(got[0]), "57014")
	mc.push(encode(t, &pgproto3.CommandComplete{CommandTag: []byte("SET")}, &pgproto3.ReadyForQuery{TxStatus: 'I'}, canceled(), &pgproto3.ReadyForQuery{TxStatus: 'I'}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, w.Wait(ctx))
	require.NoError(t, w.Err())
}

// Before the first ReadyForQuery nothing is tracked: an interrupt acts as a socket deadline.
func TestInterruptDuringStartupIsADeadline(t *testing.T) {
	mc := newMemConn()
	w := wire.New(mc, wire.Options{Grace: time.Second})
	w.Interrupt(context.DeadlineExceeded)
	_, err := w.Read(make([]byte, 16))
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "%v", err)
	w.ClearInterrupt()
	mc.push(encode(t, &pgproto3.ReadyForQuery{TxStatus: 'I'}))
	n, err := w.Read(make([]byte, 16))
	require.NoError(t, err)
	assert.Equal(t, 6, n)
}
