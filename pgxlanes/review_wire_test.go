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
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// reviewTLSConfig is a server TLS config with a self-signed certificate made here.
func reviewTLSConfig(t *testing.T) *tls.Config {
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

// Review finding 2: on a TLS connection (the wire.Conn beside pgconn's *tls.Conn, which is every
// TLS connection under the default channel_binding=prefer) in QueryExecModeExec, a batch sent
// while a drain is under way (the previous statement of the same held connection was cut by its
// context) goes straight to the socket: flushForExecBatch only flushes staged settings, and only
// when some are pending; nothing waits for the drain. The server thus receives a new request
// while the drain still sends cancel requests, which then land on the batch (a spurious 57014 on
// a call whose context never ended), and the drain's premise ("nothing new is sent on the
// session until the drain ends") is broken.
func TestReviewExecBatchPastDrainOverTLS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	srvCfg := reviewTLSConfig(t)

	type server struct {
		conn net.Conn
		be   *pgproto3.Backend
	}
	ready := make(chan server, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			return
		}
		be := pgproto3.NewBackend(raw, raw)
		m, err := be.ReceiveStartupMessage()
		if err != nil {
			return
		}
		if _, ok := m.(*pgproto3.SSLRequest); !ok {
			return
		}
		if _, err := raw.Write([]byte{'S'}); err != nil {
			return
		}
		tc := tls.Server(raw, srvCfg)
		if err := tc.Handshake(); err != nil {
			return
		}
		be = pgproto3.NewBackend(tc, tc)
		if _, err := be.ReceiveStartupMessage(); err != nil {
			return
		}
		be.Send(&pgproto3.AuthenticationOk{})
		be.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: []byte{0, 0, 0, 7}})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if be.Flush() != nil {
			return
		}
		ready <- server{conn: tc, be: be}
	}()

	cc, err := pgx.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=script sslmode=require", ln.Addr().(*net.TCPAddr).Port))
	require.NoError(t, err)
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	installWire(cc, wire.Options{ResetSQL: resetSQL, Grace: 3 * time.Second}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	var srv server
	select {
	case srv = <-ready:
	case <-time.After(5 * time.Second):
		t.Fatal("no session")
	}
	defer srv.conn.Close()
	defer conn.Close(context.Background())

	w := wireOf(conn.PgConn())
	require.NotNil(t, w)
	require.NotEqual(t, net.Conn(w), conn.PgConn().Conn(), "the wire.Conn sits beside the *tls.Conn")
	var cancels atomic.Int32
	w.SetCancel(func(context.Context) error { cancels.Add(1); return nil })

	recv := func(d time.Duration) (pgproto3.FrontendMessage, error) {
		_ = srv.conn.SetReadDeadline(time.Now().Add(d))
		defer func() { _ = srv.conn.SetReadDeadline(time.Time{}) }()
		return srv.be.Receive()
	}

	// A statement of the held connection, cut by its context: the drain starts, the server has
	// not answered yet.
	qctx, qcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := conn.Exec(qctx, "select pg_sleep(100)"); done <- err }()
	m, err := recv(5 * time.Second)
	require.NoError(t, err)
	require.IsType(t, &pgproto3.Query{}, m)
	qcancel()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the cut statement did not return")
	}
	require.True(t, w.Draining())
	require.False(t, w.Pending(), "nothing staged: flushForExecBatch does nothing")

	// The next call of the same held connection: a batch, whose context never ends.
	b := &pgx.Batch{}
	b.Queue("select 1")
	batchDone := make(chan error, 1)
	// What Conn.SendBatch does (conn.go): flushForExecBatch, then pgx's SendBatch.
	pcfg, err := pgxpool.ParseConfig("")
	require.NoError(t, err)
	pcfg.ConnConfig = cc
	l := &lease{hold: hold{p: &Pool{config: &Config{Config: pcfg}}, conn: conn, w: w}}
	require.NoError(t, flushForExecBatch(context.Background(), l))
	go func() {
		br := conn.SendBatch(context.Background(), b)
		_, err := br.Exec()
		_ = br.Close()
		batchDone <- err
	}()

	// While the drain is under way nothing new may reach the server.
	m, err = recv(500 * time.Millisecond)
	if err == nil {
		at := cancels.Load()
		time.Sleep(600 * time.Millisecond)
		after := cancels.Load() - at
		t.Errorf("the server received %T while the drain was under way (the cut statement unanswered); "+
			"the drain then sent %d more cancel requests, which a real server applies to the batch", m, after)
	}
}
