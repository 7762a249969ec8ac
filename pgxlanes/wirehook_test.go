package pgxlanes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// A wire.Conn beside pgconn's *tls.Conn (channel binding) finds the TCP socket under it
// (wire.SocketOf), to tell a write held up by the server from one whose goroutine has not run:
// the besideConn exposes the *tls.Conn, which exposes the socket. Through a wrapper that hides
// it, wire cannot tell.
func TestBesideConnShowsItsSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer nc.Close()
	if srv, ok := <-accepted; ok {
		defer srv.Close()
	}
	tc := tls.Client(nc, &tls.Config{ServerName: "localhost"})
	assert.NotNil(t, wire.SocketOf(besideConn{Conn: tc}), "the socket under the *tls.Conn")
	assert.Nil(t, wire.SocketOf(struct{ net.Conn }{tc}), "a wrapper that hides the socket")
}

// selfSignedTLS is a server TLS config with a self-signed certificate made here.
func selfSignedTLS(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// tlsScript is a scripted PostgreSQL server over TLS, and a held Conn of a lease on it in
// QueryExecModeExec, with the wire.Conn beside pgconn's *tls.Conn (installWire, as the pool
// uses it, under the default channel_binding=prefer).
type tlsScript struct {
	t       *testing.T
	srv     net.Conn
	be      *pgproto3.Backend
	conn    *Conn
	w       *wire.Conn
	cancels atomic.Int32
}

func newTLSScript(t *testing.T) *tlsScript {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	srvCfg := selfSignedTLS(t)
	s := &tlsScript{t: t}
	ready := make(chan error, 1)
	go func() {
		ready <- func() error {
			raw, err := ln.Accept()
			if err != nil {
				return err
			}
			be := pgproto3.NewBackend(raw, raw)
			m, err := be.ReceiveStartupMessage()
			if err != nil {
				return err
			}
			if _, ok := m.(*pgproto3.SSLRequest); !ok {
				return fmt.Errorf("want an SSLRequest, got %T", m)
			}
			if _, err := raw.Write([]byte{'S'}); err != nil {
				return err
			}
			tc := tls.Server(raw, srvCfg)
			if err := tc.Handshake(); err != nil {
				return err
			}
			s.srv, s.be = tc, pgproto3.NewBackend(tc, tc)
			if _, err := s.be.ReceiveStartupMessage(); err != nil {
				return err
			}
			s.be.Send(&pgproto3.AuthenticationOk{})
			s.be.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: []byte{0, 0, 0, 7}})
			s.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			return s.be.Flush()
		}()
	}()

	cc, err := pgx.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=script sslmode=require", ln.Addr().(*net.TCPAddr).Port))
	require.NoError(t, err)
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	installWire(cc, wire.Options{ResetSQL: resetSQL, Grace: 3 * time.Second}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pc, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	require.NoError(t, <-ready)
	t.Cleanup(func() {
		_ = s.srv.Close()
		_ = pc.Close(context.Background())
	})

	s.w = wireOf(pc.PgConn())
	require.NotNil(t, s.w)
	require.NotEqual(t, net.Conn(s.w), pc.PgConn().Conn(), "the wire.Conn sits beside the *tls.Conn")
	s.w.SetCancel(func(context.Context) error { s.cancels.Add(1); return nil })
	pcfg, err := pgxpool.ParseConfig("")
	require.NoError(t, err)
	pcfg.ConnConfig = cc
	l := &lease{hold: hold{p: &Pool{config: &Config{Config: pcfg}}, conn: pc, w: s.w}}
	s.conn = &Conn{l: l, gen: l.gen()}
	return s
}

// recv returns the next frontend message, or an error if none comes within d.
func (s *tlsScript) recv(d time.Duration) (pgproto3.FrontendMessage, error) {
	_ = s.srv.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = s.srv.SetReadDeadline(time.Time{}) }()
	return s.be.Receive()
}

// expect reads the next frontend message, which must be of want's type.
func (s *tlsScript) expect(want pgproto3.FrontendMessage) pgproto3.FrontendMessage {
	s.t.Helper()
	m, err := s.recv(5 * time.Second)
	require.NoError(s.t, err)
	require.IsType(s.t, want, m)
	return m
}

func (s *tlsScript) send(msgs ...pgproto3.BackendMessage) {
	s.t.Helper()
	for _, m := range msgs {
		s.be.Send(m)
	}
	require.NoError(s.t, s.be.Flush())
}

// cut runs a statement on the held Conn, or on tx if not nil, and ends it with its context: the
// drain starts, and the server has not answered yet.
func (s *tlsScript) cut(tx pgx.Tx) {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		var err error
		if tx != nil {
			_, err = tx.Exec(ctx, "select pg_sleep(100)")
		} else {
			_, err = s.conn.Exec(ctx, "select pg_sleep(100)")
		}
		done <- err
	}()
	s.expect(&pgproto3.Query{})
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(s.t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		s.t.Fatal("the cut statement did not return")
	}
	require.True(s.t, s.w.Draining())
}

// answerBatch reads a one-query batch of QueryExecModeExec and answers it with one row.
func (s *tlsScript) answerBatch(tx byte) {
	s.t.Helper()
	s.expect(&pgproto3.Parse{})
	s.expect(&pgproto3.Bind{})
	s.expect(&pgproto3.Describe{})
	s.expect(&pgproto3.Execute{})
	s.expect(&pgproto3.Sync{})
	s.send(
		&pgproto3.ParseComplete{},
		&pgproto3.BindComplete{},
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("1")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: tx},
	)
}

// Over TLS (the wire.Conn beside pgconn's *tls.Conn), a batch in QueryExecModeExec goes past the
// wire.Conn (pgconn.ExecBatch). Sent on a held connection or in a transaction whose previous
// statement was cut by its context, it waits for the drain: the server receives nothing while the
// drain's cancel requests may still come, and the batch then runs as usual.
func TestExecBatchWaitsForDrainOverTLS(t *testing.T) {
	for _, inTx := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "tx"}[inTx], func(t *testing.T) {
			s := newTLSScript(t)
			var tx pgx.Tx
			status := byte('I')
			if inTx {
				done := make(chan error, 1)
				go func() {
					var err error
					tx, err = s.conn.Begin(context.Background())
					done <- err
				}()
				s.expect(&pgproto3.Query{})
				s.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
				require.NoError(t, <-done)
				status = 'E'
			}
			s.cut(tx)

			b := &pgx.Batch{}
			b.Queue("select 1")
			batchDone := make(chan error, 1)
			go func() {
				var br pgx.BatchResults
				if tx != nil {
					br = tx.SendBatch(context.Background(), b)
				} else {
					br = s.conn.SendBatch(context.Background(), b)
				}
				_, err := br.Exec()
				if cerr := br.Close(); err == nil {
					err = cerr
				}
				batchDone <- err
			}()

			// While the drain is under way nothing new may reach the server.
			if m, err := s.recv(500 * time.Millisecond); err == nil {
				t.Fatalf("the server received %T while the drain was under way", m)
			}
			s.send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014", Message: "canceling statement due to user request"},
				&pgproto3.ReadyForQuery{TxStatus: status})
			// The empty query written through the wire.Conn once the drain ended, then the batch.
			q := s.expect(&pgproto3.Query{}).(*pgproto3.Query)
			require.Empty(t, q.String)
			cancels := s.cancels.Load()
			require.False(t, s.w.Draining())
			s.send(&pgproto3.EmptyQueryResponse{}, &pgproto3.ReadyForQuery{TxStatus: status})
			s.answerBatch(status)
			select {
			case err := <-batchDone:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("the batch did not return")
			}
			require.Equal(t, cancels, s.cancels.Load(), "a cancel request after the drain ended")
		})
	}
}

// A batch waiting for the drain is ended, unsent, when its context ends.
func TestExecBatchWaitingForDrainEndsWithItsContext(t *testing.T) {
	s := newTLSScript(t)
	s.cut(nil)
	b := &pgx.Batch{}
	b.Queue("select 1")
	ctx, cancel := context.WithCancel(context.Background())
	batchDone := make(chan error, 1)
	go func() {
		br := s.conn.SendBatch(ctx, b)
		_, err := br.Exec()
		_ = br.Close()
		batchDone <- err
	}()
	if m, err := s.recv(200 * time.Millisecond); err == nil {
		t.Fatalf("the server received %T while the drain was under way", m)
	}
	cancel()
	select {
	case err := <-batchDone:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the batch did not return")
	}
	s.send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014", Message: "canceling statement due to user request"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	// The session serves the next call; the batch never reached the server.
	done := make(chan error, 1)
	go func() { _, err := s.conn.Exec(context.Background(), "select 1"); done <- err }()
	q := s.expect(&pgproto3.Query{}).(*pgproto3.Query)
	require.Equal(t, "select 1", q.String)
	s.send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.NoError(t, <-done)
}

// Over TLS with channel binding, a batch the user sends with the held connection's own PgConn
// (pgconn.ExecBatch writes past the wire.Conn, to the *tls.Conn) after a statement cut by its
// context waits for the drain, as the pool's own batches do (flushForExecBatch): the drain's
// cancel request, late here, reaches the server once the cut statement has ended by itself, and
// must not cancel the batch. The cancel requests are held at the dial until the server no longer
// runs the cut statement; sent during the drain, the batch would be running by then. The
// reference is pgxpool with pgx's own way to keep a connection whose statement's context ended
// (a cancel request, then the server's reply): its batch runs too.
func TestUserExecBatchWaitsForDrainOverTLS(t *testing.T) {
	srv := pgserver.NewLocal(t, pgserver.Options{TLS: true, HostSSLOnly: true, MaxConnections: 20})
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the drain and the waits end with the pools
	ctx := context.Background()
	observer, err := pgx.Connect(ctx, srv.DSN())
	require.NoError(t, err)
	defer observer.Close(ctx)

	var gate atomic.Pointer[chan struct{}] // when set, dials (the cancel requests') wait for it
	gated := func(cc *pgx.ConnConfig) {
		dial := cc.DialFunc
		cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if g := gate.Load(); g != nil {
				select {
				case <-*g:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return dial(ctx, network, addr)
		}
	}
	const cutSQL = "select pg_sleep(0.5) -- cut"
	cutRunning := func(pid uint32) bool {
		var state, query string
		require.NoError(t, observer.QueryRow(ctx, "select state, query from pg_stat_activity where pid = $1", pid).Scan(&state, &query))
		return state == "active" && query == cutSQL
	}
	// run cuts cutSQL on a connection with the cancel requests held, then sends a batch with
	// batchConn's PgConn; it returns the cut statement's error and the batch's.
	run := func(t *testing.T, pid uint32, cut func(context.Context) error, batchConn func() *pgx.Conn) (cutErr, batchErr error) {
		held := make(chan struct{})
		gate.Store(&held)
		cutCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		cutDone := make(chan error, 1)
		go func() { cutDone <- cut(cutCtx) }()
		pgserver.Eventually(t, 10*time.Second, "the cut statement runs", func() bool { return cutRunning(pid) })
		batchDone := make(chan error, 1)
		go func() {
			cutErr = <-cutDone
			b := &pgconn.Batch{}
			b.ExecParams("select pg_sleep(1) -- batch", nil, nil, nil, nil)
			_, err := batchConn().PgConn().ExecBatch(ctx, b).ReadAll()
			batchDone <- err
		}()
		pgserver.Eventually(t, 10*time.Second, "the cut statement ends on the server", func() bool { return !cutRunning(pid) })
		gate.Store(nil)
		close(held)
		select {
		case batchErr = <-batchDone:
			return cutErr, batchErr
		case <-time.After(10 * time.Second):
			t.Fatal("the batch did not return")
			return nil, nil
		}
	}

	t.Run("pgxpool", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(srv.DSN())
		require.NoError(t, err)
		cfg.MaxConns = 1
		gated(cfg.ConnConfig)
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer p.Close()
		conn, err := p.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		// pgx waits for the cancel request: the statement ends by itself first, and succeeds.
		_, err = run(t, conn.Conn().PgConn().PID(), func(ctx context.Context) error {
			_, err := conn.Exec(ctx, cutSQL)
			return err
		}, conn.Conn)
		require.NoError(t, err)
	})

	t.Run("pgxlanes", func(t *testing.T) {
		cfg, err := ParseConfig(srv.DSN())
		require.NoError(t, err)
		cfg.MaxConns = 1
		gated(cfg.ConnConfig)
		p, err := NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer p.Close()
		conn, err := p.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		pc := conn.Conn().PgConn()
		require.NotNil(t, wireOf(pc))
		require.NotEqual(t, net.Conn(wireOf(pc)), pc.Conn(), "the wire.Conn sits beside the *tls.Conn")
		cutErr, err := run(t, pc.PID(), func(ctx context.Context) error {
			_, err := conn.Exec(ctx, cutSQL)
			return err
		}, conn.Conn)
		require.ErrorIs(t, cutErr, context.DeadlineExceeded, "the statement returns at its deadline")
		require.NoError(t, err, "the drain's cancel request ended the batch")
		var one int
		require.NoError(t, conn.QueryRow(ctx, "select 1").Scan(&one))
	})
}
