package stdlib

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// OptionOpenDB configures the connector of OpenDBFromPool and GetPoolConnector.
type OptionOpenDB func(*connector)

// OptionPinLane makes every connection that database/sql takes out pin a held connection of lane
// l for as long as database/sql has it out, as pgx's stdlib does for all of them: session state
// carries across the statements of a sql.Conn whatever their ctx says. Statements then run on l,
// not on Short. It is meant for a *sql.DB of its own given to code that relies on sessions and
// cannot annotate its contexts, such as a migration tool that takes an advisory lock. l must be
// Tx or Long: a pinned connection's hold time is unbounded, and Short's must be bounded.
func OptionPinLane(l pgxlanes.Lane) OptionOpenDB {
	return func(c *connector) {
		if l != pgxlanes.Tx && l != pgxlanes.Long {
			c.err = fmt.Errorf("pgxlanes/stdlib: OptionPinLane: lane %v cannot be pinned (use tx or long: a pinned connection's hold time is unbounded)", l)
			return
		}
		c.defaults = pgxlanes.Annotations{Lane: l, LaneSet: true}
	}
}

// GetPoolConnector returns a driver.Connector whose connections run on pool; see the package
// documentation for how calls are routed. Unlike pgx's, it needs no SetMaxIdleConns(0): its idle
// connections hold nothing of the pool. A nil pool or a bad option makes every connection attempt
// fail with an error that names it.
func GetPoolConnector(pool *pgxlanes.Pool, opts ...OptionOpenDB) driver.Connector {
	c := &connector{pool: pool}
	if pool == nil {
		c.err = errors.New("pgxlanes/stdlib: OpenDBFromPool: pool is nil")
	}
	for _, opt := range opts {
		if opt != nil && c.err == nil {
			opt(c)
		}
	}
	return c
}

// OpenDBFromPool returns a *sql.DB whose calls run on pool: statements on the Short lane,
// transactions on the Tx lane, each holding its lane slot only for its own duration (see the
// package documentation). Closing the *sql.DB does not close the pool.
func OpenDBFromPool(pool *pgxlanes.Pool, opts ...OptionOpenDB) *sql.DB {
	return sql.OpenDB(GetPoolConnector(pool, opts...))
}

type connector struct {
	pool     *pgxlanes.Pool
	defaults pgxlanes.Annotations // what a connection taken out with an unannotated ctx gets
	err      error                // bad input, reported by every Connect
}

// Connect returns a connection that holds nothing yet: the pool's connections are taken per call.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	if c.err != nil {
		return nil, c.err
	}
	conn := &Conn{pool: c.pool, defaults: c.defaults}
	by := takenBy()
	conn.checkOut(ctx, by == takerSQLConn)
	// database/sql's opener goroutine: the connection goes to a caller that the driver does not
	// see, now or from the idle list, and the first call decides (Conn.decide).
	conn.unseen, conn.pending = by == takerUnseen, by == takerUnseen
	return conn, nil
}

func (c *connector) Driver() driver.Driver { return Driver{} }

// Driver is the driver.Driver of the connector. It has no data source names: a *sql.DB on a
// pgxlanes pool is made with OpenDBFromPool, not sql.Open.
type Driver struct{}

// Open fails: see OpenDBFromPool.
func (Driver) Open(string) (driver.Conn, error) {
	return nil, errors.New("pgxlanes/stdlib: no data source names; open a *sql.DB with stdlib.OpenDBFromPool(pool)")
}
