package stdlib

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// PrepareContext prepares query. On a pinned session (a sql.Conn's, or a connection whose ctx
// named a lane) it is prepared on the server, as pgx's stdlib does: named by its text, so that
// the statement's calls find it in pgx's prepared statements, and a syntax error is reported
// here. Elsewhere nothing is prepared: the statement has no session of its own to live in, and
// pgx's statement cache prepares it on each session that runs it (see the package
// documentation). ctx bounds the acquire of a session to pin and the prepare.
func (c *Conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.closed {
		return nil, driver.ErrBadConn
	}
	if c.pending && c.held == nil {
		c.decide()
	}
	if c.held == nil && !c.session {
		return &Stmt{c: c, query: query}, nil
	}
	held := c.held
	if held == nil {
		var err error
		lctx, _ := c.callCtx(ctx)
		if held, err = c.pin(lctx); err != nil {
			return nil, err
		}
	}
	sd, err := held.Conn().Prepare(ctx, query, query)
	if err != nil {
		return nil, err
	}
	if c.prepared == nil {
		c.prepared = make(map[string]int)
	}
	c.prepared[query]++
	return &Stmt{c: c, query: query, sd: sd, pin: c.pins}, nil
}

// Stmt is a prepared statement. Its calls run its text on its connection, as its connection's
// own calls do: on the session it was prepared on, that runs the server's prepared statement.
type Stmt struct {
	c     *Conn
	query string
	sd    *pgconn.StatementDescription // nil: not prepared on the server
	pin   uint64                       // c.pins when sd was prepared: its session
}

// Close deallocates the statement on the server when no other Stmt of its session shares it,
// as pgx's stdlib does. A statement whose session was released was deallocated then.
func (s *Stmt) Close() error {
	c := s.c
	if s.sd == nil || c.held == nil || c.pins != s.pin {
		return nil
	}
	s.sd = nil
	if c.prepared[s.query] > 1 {
		c.prepared[s.query]--
		return nil
	}
	delete(c.prepared, s.query)
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	return c.held.Conn().Deallocate(ctx, s.query)
}

// NumInput is the number of parameters of a statement prepared on the server, and -1 otherwise:
// database/sql then does not check the argument count.
func (s *Stmt) NumInput() int {
	if s.sd == nil {
		return -1
	}
	return len(s.sd.ParamOIDs)
}

func (s *Stmt) Exec([]driver.Value) (driver.Result, error) {
	return nil, errors.New("pgxlanes/stdlib: Stmt.Exec is deprecated and not implemented")
}

func (s *Stmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("pgxlanes/stdlib: Stmt.Query is deprecated and not implemented")
}

func (s *Stmt) ExecContext(ctx context.Context, argsV []driver.NamedValue) (driver.Result, error) {
	return s.c.ExecContext(ctx, s.query, argsV)
}

func (s *Stmt) QueryContext(ctx context.Context, argsV []driver.NamedValue) (driver.Rows, error) {
	return s.c.QueryContext(ctx, s.query, argsV)
}
