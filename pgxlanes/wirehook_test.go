package pgxlanes

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
