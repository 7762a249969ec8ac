package wire_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// The scripted backend: a pgproto3.Backend on the server's side of a loopback socket, driving a
// real pgconn.PgConn through a wire.Conn. Each test plays the server message by message, so that
// every order of messages, and an interrupt between any two, is a deterministic unit test.

// script is one scripted session.
type script struct {
	t   *testing.T
	be  *pgproto3.Backend
	srv net.Conn   // the server's side
	cut *cutConn   // the client's side, under w
	w   *wire.Conn // under pc
	pc  *pgconn.PgConn

	mu      sync.Mutex
	cancels int           // cancel requests sent by a drain
	cancel  chan struct{} // one value per cancel request
	notices []*pgconn.Notice
	// notified are the payloads of the notifications pgconn received.
	notified []string
}

// scriptOptions are the wire options of a scripted session: a short grace, so that a test whose
// server stays silent ends quickly.
var scriptOptions = wire.Options{ResetSQL: "RESET ALL", Grace: 2 * time.Second}

// newScript connects a pgconn to a scripted server through a wire.Conn with opts.
func newScript(t *testing.T, opts wire.Options) *script {
	t.Helper()
	return newScriptOf(t, opts, false)
}

// newHiddenScript is newScript with the socket hidden from wire (cutConn.opaque), as under a
// wrapper of the user's that does not expose it.
func newHiddenScript(t *testing.T, opts wire.Options) *script {
	t.Helper()
	return newScriptOf(t, opts, true)
}

func newScriptOf(t *testing.T, opts wire.Options, hidden bool) *script {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	s := &script{t: t, cancel: make(chan struct{}, 64)}

	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err
			return
		}
		s.srv = c
		s.be = pgproto3.NewBackend(c, c)
		if _, err := s.be.ReceiveStartupMessage(); err != nil {
			accepted <- err
			return
		}
		s.be.Send(&pgproto3.AuthenticationOk{})
		s.be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0"})
		s.be.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: []byte{0, 0, 0, 7}})
		s.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		accepted <- s.be.Flush()
	}()

	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=script sslmode=disable", ln.Addr().(*net.TCPAddr).Port))
	require.NoError(t, err)
	cfg.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, c net.Conn) (net.Conn, error) {
		s.cut = &cutConn{Conn: c, opaque: hidden}
		s.w = wire.New(s.cut, opts)
		return s.w, nil
	}
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		w := pc.Conn().(*wire.Conn)
		w.SetCancel(func(context.Context) error {
			s.mu.Lock()
			s.cancels++
			s.mu.Unlock()
			s.cancel <- struct{}{}
			return nil // acknowledged
		})
		return w
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		s.mu.Lock()
		s.notices = append(s.notices, n)
		s.mu.Unlock()
	}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		s.mu.Lock()
		s.notified = append(s.notified, n.Payload)
		s.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.pc, err = pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	t.Cleanup(func() {
		_ = s.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.pc.Close(ctx)
	})
	return s
}

// recv returns the next frontend message the server reads, failing the test after 5 s.
func (s *script) recv() pgproto3.FrontendMessage {
	s.t.Helper()
	_ = s.srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = s.srv.SetReadDeadline(time.Time{}) }()
	m, err := s.be.Receive()
	require.NoError(s.t, err, "the server waited for a message")
	return m
}

// expectQuery reads a Query message and returns its SQL.
func (s *script) expectQuery() string {
	s.t.Helper()
	m := s.recv()
	q, ok := m.(*pgproto3.Query)
	require.True(s.t, ok, "want a Query, got %T", m)
	return q.String
}

// silent asserts that the server receives nothing within d.
func (s *script) silent(d time.Duration) {
	s.t.Helper()
	_ = s.srv.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = s.srv.SetReadDeadline(time.Time{}) }()
	m, err := s.be.Receive()
	var ne net.Error
	require.True(s.t, errors.As(err, &ne) && ne.Timeout(), "the server received %T %+v, %v", m, m, err)
}

// send sends messages and flushes them.
func (s *script) send(msgs ...pgproto3.BackendMessage) {
	s.t.Helper()
	for _, m := range msgs {
		s.be.Send(m)
	}
	require.NoError(s.t, s.be.Flush())
}

// sendRaw writes bytes as they are, for split headers and torn segments.
func (s *script) sendRaw(b []byte) {
	s.t.Helper()
	_, err := s.srv.Write(b)
	require.NoError(s.t, err)
}

// awaitCancel waits for the drain's cancel request.
func (s *script) awaitCancel() {
	s.t.Helper()
	select {
	case <-s.cancel:
	case <-time.After(5 * time.Second):
		s.t.Fatal("no cancel request")
	}
}

// waitClean waits for the end of a drain and returns why the Conn broke, or nil.
func (s *script) waitClean() error {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(s.t, s.w.Wait(ctx), "the drain did not end")
	return s.w.Err()
}

// answer sends the reply of a simple query with one row per value.
func (s *script) answer(tx byte, values ...string) {
	s.t.Helper()
	msgs := []pgproto3.BackendMessage{&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}}}
	for _, v := range values {
		msgs = append(msgs, &pgproto3.DataRow{Values: [][]byte{[]byte(v)}})
	}
	msgs = append(msgs, &pgproto3.CommandComplete{CommandTag: []byte(fmt.Sprintf("SELECT %d", len(values)))}, &pgproto3.ReadyForQuery{TxStatus: tx})
	s.send(msgs...)
}

// canceled is the server's reply to a cancelled statement.
func canceled() *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014", Message: "canceling statement due to user request"}
}

// exec runs sql on the client in the background; the result arrives on the returned channel.
func (s *script) exec(ctx context.Context, sql string) <-chan execResult {
	ch := make(chan execResult, 1)
	go func() {
		start := time.Now()
		res, err := s.pc.Exec(ctx, sql).ReadAll()
		ch <- execResult{res: res, err: err, took: time.Since(start)}
	}()
	return ch
}

type execResult struct {
	res  []*pgconn.Result
	err  error
	took time.Duration
}

func (r execResult) firstErr() error {
	if r.err != nil {
		return r.err
	}
	for _, x := range r.res {
		if x.Err != nil {
			return x.Err
		}
	}
	return nil
}

// result waits for a background call.
func result(t *testing.T, ch <-chan execResult) execResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not return")
		return execResult{}
	}
}

// requireCanceled asserts err is the server's (or a synthetic) 57014.
func requireCanceled(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want a 57014, got %v", err)
	require.Equal(t, "57014", pgErr.Code)
}

// rows returns the values of the first column of a result.
func rows(r *pgconn.Result) []string {
	var out []string
	for _, row := range r.Rows {
		out = append(out, string(row[0]))
	}
	return out
}

// roundTrip checks that the session serves a plain query after whatever came before.
func (s *script) roundTrip() {
	s.t.Helper()
	ch := s.exec(context.Background(), "select 'ok'")
	require.Equal(s.t, "select 'ok'", s.expectQuery())
	s.answer('I', "ok")
	r := result(s.t, ch)
	require.NoError(s.t, r.firstErr())
	require.Equal(s.t, []string{"ok"}, rows(r.res[0]))
}

// An interrupt between two statements of pgconn's, while the reply of a query queued with After
// (SET LOCAL after a BEGIN, behind a pooler) is still unread, waits for the next request: that
// request is ended at once and cancelled on the server. The server answers the BEGIN first and
// flushes (PostgreSQL flushes at every ReadyForQuery), so pgconn is idle with only a staged
// query's reply outstanding; the interrupt must not be taken as one that found nothing to end.
func TestScriptInterruptWithOnlyAfterReplyUnread(t *testing.T) {
	s := newScript(t, scriptOptions)
	s.w.After("set local lock_timeout = 1")
	ch := s.exec(context.Background(), "begin")
	require.Equal(t, "begin", s.expectQuery())
	require.Equal(t, "set local lock_timeout = 1", s.expectQuery())
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
	require.NoError(t, result(t, ch).firstErr())

	// pgconn is idle: the budget guard interrupts the lease between two statements.
	budget := errors.New("over budget")
	s.w.Interrupt(budget)
	// The SET LOCAL's reply arrives meanwhile.
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("SET")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})

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
	require.ErrorIs(t, s.w.Cause(), budget)
	s.awaitCancel()
	s.send(canceled(), &pgproto3.ReadyForQuery{TxStatus: 'E'})
	require.NoError(t, s.waitClean())
	require.False(t, s.w.Failed())
}

// The drain keeps for pgconn a notice of the cut request, a notification or a ParameterStatus
// larger than its stash, as it keeps a small one: it reads it whole.
func TestScriptDrainKeepsLargeMessages(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	big := strings.Repeat("n", 12<<10)
	s.send(
		&pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: "small"},
		&pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: big},
		&pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: big + "a"},
		&pgproto3.ParameterStatus{Name: "application_name", Value: big + "s"},
		&pgproto3.DataRow{Values: [][]byte{[]byte(big + "dropped")}},
		canceled(),
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	require.NoError(t, s.waitClean())
	s.roundTrip() // pgconn reads what the drain kept
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.notices, 2, "the drain kept the small notice and dropped the large one")
	require.Equal(t, big, s.notices[1].Message)
	require.Equal(t, []string{big + "a"}, s.notified)
	require.Equal(t, big+"s", s.pc.ParameterStatus("application_name"))
}

// A FATAL larger than the drain's stash (a long DETAIL) reaches pgconn, as a small one does.
func TestScriptDrainKeepsALargeFatal(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	detail := strings.Repeat("d", 20<<10)
	s.send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command", Detail: detail})
	_ = s.srv.Close()
	require.Error(t, s.waitClean())

	_, err := s.pc.Exec(context.Background(), "select 1").ReadAll()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want the server's FATAL, got %v", err)
	require.Equal(t, "57P01", pgErr.Code)
	require.Equal(t, detail, pgErr.Detail)
}

// A message the drain would keep for pgconn but that is larger than it keeps breaks the Conn at
// once, with a reason, instead of being dropped unseen.
func TestScriptDrainBreaksOnAHugeKeptMessage(t *testing.T) {
	s := newScript(t, scriptOptions)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.exec(ctx, "select pg_sleep(100)")
	require.Equal(t, "select pg_sleep(100)", s.expectQuery())
	cancel()
	requireCanceled(t, result(t, ch).firstErr())
	s.awaitCancel()
	start := time.Now()
	s.send(&pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: strings.Repeat("n", 1<<20)})
	err := s.waitClean()
	require.Error(t, err)
	require.Contains(t, err.Error(), "larger than")
	require.Less(t, time.Since(start), scriptOptions.Grace/2, "the drain went on after the Conn broke")
}
