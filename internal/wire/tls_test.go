package wire_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// The live tests of wire run over plain TCP and, as subtests of TestLiveOverTLS, over TLS: a
// server started with ssl=on and a certificate made here, and a wire.Conn over the *tls.Conn
// (above TLS, where it must sit: it reads the protocol in the clear).

// tlsDSNs maps the name of a running TestLiveOverTLS to its server's DSN.
var tlsDSNs sync.Map

// tlsDSN returns the DSN of the TLS server t runs under, if it runs under TestLiveOverTLS.
func tlsDSN(t *testing.T) (string, bool) {
	root, _, _ := strings.Cut(t.Name(), "/")
	dsn, ok := tlsDSNs.Load(root)
	if !ok {
		return "", false
	}
	return dsn.(string), true
}

func overTLS(t *testing.T) bool {
	_, ok := tlsDSN(t)
	return ok
}

// liveDSN is the DSN of the server a live test runs against.
func liveDSN(t *testing.T) string {
	if dsn, ok := tlsDSN(t); ok {
		return dsn
	}
	return pgserver.DSN(t)
}

// liveDatabase is a database of its own for a live test (the TLS server is the test's own).
func liveDatabase(t *testing.T) string {
	if dsn, ok := tlsDSN(t); ok {
		return dsn
	}
	return pgserver.NewDatabase(t)
}

// dialTLS dials the server and negotiates TLS itself (SSLRequest, then the handshake), so that
// pgconn, told sslmode=disable, speaks the protocol over the *tls.Conn and wire sits above TLS.
func dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		c.Close()
		return nil, err
	}
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil {
		c.Close()
		return nil, err
	}
	if b[0] != 'S' {
		c.Close()
		return nil, errors.New("the server refused TLS")
	}
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a certificate made by the test
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// startTLSServer starts a PostgreSQL with ssl=on and a self-signed certificate for 127.0.0.1.
func startTLSServer(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgxlanes-wire-tls-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // the server's user reads it

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	if os.Geteuid() == 0 {
		// The harness runs the server as postgres; the key must be its own, mode 0600.
		u, err := user.Lookup("postgres")
		require.NoError(t, err)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(keyFile, uid, gid))
		require.NoError(t, os.Chown(certFile, uid, gid))
	}
	s := pgserver.NewLocal(t, pgserver.Options{MaxConnections: 20, Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": certFile, "ssl_key_file": keyFile,
	}})
	return s.DSN()
}

// TestLiveOverTLS runs every live test of wire over TLS.
func TestLiveOverTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server of its own")
	}
	dsn := startTLSServer(t)
	tlsDSNs.Store(t.Name(), dsn)
	defer tlsDSNs.Delete(t.Name())

	t.Run("the session is encrypted", func(t *testing.T) {
		c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
		var ssl bool
		require.NoError(t, c.QueryRow(context.Background(), "select ssl from pg_stat_ssl where pid = pg_backend_pid()").Scan(&ssl))
		require.True(t, ssl)
		_, ok := w.Conn.(*tls.Conn)
		require.True(t, ok, "wire sits above TLS")
	})
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"DeadlineReturnsAtOnceAndKeepsSession", TestDeadlineReturnsAtOnceAndKeepsSession},
		{"StagedSettingsCostNoRoundTripAndAreSwallowed", TestStagedSettingsCostNoRoundTripAndAreSwallowed},
		{"AfterBegin", TestAfterBegin},
		{"RowsInterruptedMidStream", TestRowsInterruptedMidStream},
		{"TransactionAbortedThenRolledBack", TestTransactionAbortedThenRolledBack},
		{"BatchInterrupted", TestBatchInterrupted},
		{"NamedPrepareInterruptedIsUndone", TestNamedPrepareInterruptedIsUndone},
		{"WaitForNotificationTimesOutAndKeepsSession", TestWaitForNotificationTimesOutAndKeepsSession},
		{"CopyInterruptedKeepsSession", TestCopyInterruptedKeepsSession},
		{"DescheduledWriteKeepsSession", TestDescheduledWriteKeepsSession},
	} {
		t.Run(tc.name, tc.f)
	}
}
