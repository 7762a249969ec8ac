package pgxlanes

import (
	"context"
	"crypto/tls"
	"io"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// This file is where a wire.Conn enters pgconn's path, without taking anything pgconn does on the
// connection away.
//
// pgconn binds a SCRAM login to the TLS session (channel binding, tls-server-end-point) only when
// the connection it authenticates on is a *tls.Conn. So a TLS connection keeps pgconn's
// *tls.Conn: the wire.Conn goes beside it, as the reader and writer of pgconn's protocol frontend
// (pgconn.Config.BuildFrontend), reading through pgconn's background reader and writing to the
// *tls.Conn, whose deadlines and Close it shares. pgconn authenticates on the *tls.Conn exactly as
// with pgxpool, so channel_binding=require connects and a TLS interceptor with its own
// certificate is refused under the default channel_binding=prefer.
//
// Every other connection (no TLS, channel_binding=disable, or a user's AfterNetConnect that
// returned a wrapper of its own, where pgconn cannot bind either) gets the wire.Conn under pgconn,
// returned by AfterNetConnect, as before. The one difference between the two places: pgconn
// writes a batch in QueryExecModeExec (pgconn.ExecBatch) to its connection directly, past the
// frontend; see flushForExecBatch.

// wireKey is where a connection's wire.Conn is kept in pgconn's CustomData when it sits beside
// pgconn's connection rather than under it.
const wireKey = "pgxlanes.wire"

// wireOf returns the wire.Conn in c's path, or nil if it has none (a connection opened before the
// hooks, which cannot happen in a Pool).
func wireOf(c *pgconn.PgConn) *wire.Conn {
	if w, ok := c.Conn().(*wire.Conn); ok {
		return w
	}
	w, _ := c.CustomData()[wireKey].(*wire.Conn)
	return w
}

// bindsChannel reports whether pgconn may bind a SCRAM login to conn's TLS session, so that conn
// must stay pgconn's connection during authentication.
func bindsChannel(c *pgconn.Config, conn io.Writer) bool {
	_, isTLS := conn.(*tls.Conn)
	return isTLS && c.ChannelBinding != "disable"
}

// besideConn is what a wire.Conn beside pgconn's connection wraps: that connection, read through
// pgconn's background reader, which alone may read from it.
type besideConn struct {
	net.Conn
	r io.Reader
}

func (c besideConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// NetConn returns the connection c wraps, so that wire can look at its socket (a stalled write).
func (c besideConn) NetConn() net.Conn { return c.Conn }

// installWire sets, on the ConnConfig of one connection being opened (pgxpool's copy, after the
// user's BeforeConnect), the hooks that put a wire.Conn with opts in its path and make it the
// connection's context watcher. The user's AfterNetConnect, BuildFrontend and
// BuildContextWatcherHandler are kept and run first; a handler the user set replaces the
// wire.Conn's, and then deadlines behave as that handler decides.
func installWire(cc *pgx.ConnConfig, opts wire.Options, made func(*wire.Conn)) {
	userAfterNet := cc.AfterNetConnect
	userFrontend := cc.BuildFrontend
	userHandler := cc.BuildContextWatcherHandler
	if isDefaultHandler(userHandler) {
		userHandler = nil
	}
	// beside is the wire.Conn that BuildFrontend put beside the connection of the attempt under
	// way, for the context watcher handler built when it is ready. pgconn tries a multi-host
	// DSN's hosts one at a time, so one variable per connection suffices.
	var beside *wire.Conn
	cc.AfterNetConnect = func(ctx context.Context, c *pgconn.Config, conn net.Conn) (net.Conn, error) {
		beside = nil
		if userAfterNet != nil {
			var err error
			if conn, err = userAfterNet(ctx, c, conn); err != nil {
				return nil, err
			}
		}
		if bindsChannel(c, conn) {
			return conn, nil // BuildFrontend puts the wire.Conn beside it
		}
		return wire.New(conn, opts), nil
	}
	cc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		if conn, ok := w.(net.Conn); ok && bindsChannel(&cc.Config, w) {
			beside = wire.New(besideConn{Conn: conn, r: r}, opts)
			r, w = beside, beside
		}
		if userFrontend != nil {
			return userFrontend(r, w)
		}
		return pgproto3.NewFrontend(r, w)
	}
	cc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		w, ok := c.Conn().(*wire.Conn)
		if !ok && beside != nil {
			w, ok = beside, true
			c.CustomData()[wireKey] = w
			beside = nil
		}
		if ok {
			w.SetCancel(c.CancelRequest)
			if made != nil {
				made(w)
			}
		}
		switch {
		case userHandler != nil:
			return userHandler(c)
		case !ok:
			return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
		}
		return w
	}
}

// flushForExecBatch readies lease l's wire.Conn for a batch that pgconn will write past it: in
// QueryExecModeExec, pgconn.ExecBatch writes a batch straight to its connection, so where the
// wire.Conn sits beside a *tls.Conn the batch would neither wait for a drain under way (the
// previous statement of a held connection or transaction cut by its context: the drain's cancel
// requests could then end the batch, its CopyFail follow the batch) nor carry the staged
// settings. An empty query, written through the wire.Conn, does both: its write waits for the
// drain, and is ended at once, unsent, if ctx ends or the guard acts meanwhile, as any request's;
// the settings go before it. One round trip, in this case alone (a TLS connection with channel
// binding, QueryExecModeExec, settings to change or a drain under way). Every batch of a lease
// that may go through ExecBatch must call it first.
func flushForExecBatch(ctx context.Context, l *lease) error {
	if l.w == nil || l.p.config.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeExec ||
		l.conn.PgConn().Conn() == net.Conn(l.w) || !l.w.Pending() && !l.w.Draining() {
		return nil
	}
	return l.conn.PgConn().Exec(ctx, "").Close()
}

// drained is a Cleaner that closes its channel when the drain it waited for ends.
type drained chan struct{}

func (d drained) Cleaned(bool) { close(d) }

// awaitDrainBeside waits for a drain of lease l's wire.Conn to end where it sits beside a
// *tls.Conn, before the lease's *pgx.Conn is handed to the user (Conn.Conn, Tx.Conn): with it the
// user may write a batch past the wire.Conn (pgconn.ExecBatch, or pgx in QueryExecModeExec),
// which flushForExecBatch cannot ready, and the drain's cancel requests would then end the batch
// on the server. A drain ends within CancelGrace; elsewhere the wire.Conn is pgconn's connection,
// and a batch's own write waits for it.
func awaitDrainBeside(l *lease) {
	if l.w == nil || l.conn.PgConn().Conn() == net.Conn(l.w) || !l.w.Draining() {
		return
	}
	d := make(drained)
	if l.w.OnClean(d) {
		<-d
	}
}
