package pgxlanes

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

type errRows struct{ err error }

func (errRows) Close()                                       {}
func (e errRows) Err() error                                 { return e.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (e errRows) Scan(dest ...any) error                     { return e.err }
func (e errRows) Values() ([]any, error)                     { return nil, e.err }
func (e errRows) RawValues() [][]byte                        { return nil }
func (e errRows) Conn() *pgx.Conn                            { return nil }
func (e errRows) TypeMap() *pgtype.Map                       { return nil }

type errRow struct{ err error }

func (e errRow) Scan(dest ...any) error { return e.err }

// leaseRows are the rows of a query on a lease. Their error goes through the lease (fail): the
// context's error for a read interrupted by its context, a *BudgetError once the guard acted, a
// lock timeout's holders named. The rows of a pool query (release) hold their lease until they
// end: at Close, when Next returns false, or when Scan or Values fail; their error is settled
// then, before the connection may serve someone else. Those of a transaction, held connection
// or batch leave the lease to its owner, and refuse to read once the owner released it.
type leaseRows struct {
	pgx.Rows
	l       *lease
	gen     uint64 // the hold the rows belong to
	release bool
	closed  bool
	err     error // the settled error, once closed; ErrReleased for rows of a released lease
}

// gone reports whether the rows belong to a lease its owner released: the connection may serve
// someone else, so the rows must not touch it.
func (r *leaseRows) gone() bool {
	if !r.release && !r.closed && r.l.stale(r.gen) {
		r.closed, r.err = true, ErrReleased
		return true
	}
	return false
}

func (r *leaseRows) Close() {
	if r.closed || r.gone() {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.l.fail(r.Rows.Err())
	if r.release {
		r.l.release(r.gen)
	}
}

func (r *leaseRows) Err() error {
	if r.closed || r.gone() {
		return r.err
	}
	return r.l.fail(r.Rows.Err())
}

func (r *leaseRows) Next() bool {
	if r.closed || r.gone() {
		return false
	}
	if !r.Rows.Next() {
		r.Close() // pgx has closed them already; this settles the error and releases once
		return false
	}
	return true
}

// stale reports whether the rows belong to a lease that was released: they must not reach its
// connection, which may serve another caller, however often they are asked.
func (r *leaseRows) stale() bool {
	if r.release || !r.l.stale(r.gen) {
		return false
	}
	r.gone()
	return true
}

func (r *leaseRows) Scan(dest ...any) error {
	if r.stale() {
		return ErrReleased
	}
	err := r.Rows.Scan(dest...)
	if err != nil {
		r.Close()
	}
	return err
}

func (r *leaseRows) Values() ([]any, error) {
	if r.stale() {
		return nil, ErrReleased
	}
	values, err := r.Rows.Values()
	if err != nil {
		r.Close()
	}
	return values, err
}

func (r *leaseRows) Conn() *pgx.Conn {
	if r.l.stale(r.gen) {
		return nil
	}
	return r.Rows.Conn()
}

// leaseRow is the row of a QueryRow on a lease. A pool QueryRow's row (release) gives the lease
// back when Scan returns, or panics, after settling its error; a second Scan gets pgx's own
// answer for its closed row, and leaves the lease alone.
type leaseRow struct {
	r       pgx.Row
	l       *lease
	gen     uint64 // the hold the row belongs to
	release bool
}

func (row *leaseRow) Scan(dest ...any) (err error) {
	if row.release {
		if row.l.stale(row.gen) {
			return row.r.Scan(dest...)
		}
		defer row.l.release(row.gen)
	} else if err := row.l.check(row.gen); err != nil {
		return err
	}
	return row.l.fail(row.r.Scan(dest...))
}

// leaseBatch are the results of a batch sent on a lease: by the pool, by a transaction or on a
// held connection. A pool batch releases its lease at Close, unless it began a transaction,
// which then owns the lease and releases it on Commit or Rollback.
type leaseBatch struct {
	br      pgx.BatchResults
	l       *lease
	gen     uint64   // the hold the batch belongs to
	release bool     // Close releases l
	tx      *leaseTx // the pool batch's transaction, or nil
	heldTx  *leaseTx // a held connection's or transaction's batch's transaction, made by Tx
	closed  bool
	err     error // Close's error, returned again by a second Close as pgx does
	// hidden is the number of pgxlanes' own queries (a transaction's SET LOCALs behind a
	// transaction pooler, see batch.go) queued after the first one, and reads counts the caller's
	// reads, so that their results are read and dropped before the caller's second read.
	hidden int
	reads  int
}

// next skips the hidden results when the caller's next read would get them. Their errors are
// dropped: pgx gives the caller's own read the batch's error, and that read must be made anyway,
// since in some exec modes each failed read still takes its query's turn.
// A batch whose hold is over (a held connection released, a transaction ended) refuses to read:
// its connection may serve someone else. One already closed gets pgx's own answer, which does
// not touch the connection.
func (br *leaseBatch) next() error {
	if br.l.stale(br.gen) {
		return ErrReleased
	}
	if br.reads == 1 {
		for ; br.hidden > 0; br.hidden-- {
			_, _ = br.br.Exec()
		}
	}
	br.reads++
	return nil
}

func (br *leaseBatch) Exec() (pgconn.CommandTag, error) {
	if br.closed {
		return br.br.Exec()
	}
	if err := br.next(); err != nil {
		return pgconn.CommandTag{}, err
	}
	ct, err := br.br.Exec()
	return ct, br.l.fail(err)
}

func (br *leaseBatch) Query() (pgx.Rows, error) {
	if br.closed {
		return br.br.Query()
	}
	if err := br.next(); err != nil {
		return errRows{err: err}, err
	}
	rows, err := br.br.Query()
	if err != nil {
		err = br.l.fail(err)
		return errRows{err: err}, err
	}
	return br.l.newRows(rows, false), nil
}

func (br *leaseBatch) QueryRow() pgx.Row {
	if br.closed {
		return br.br.QueryRow()
	}
	if err := br.next(); err != nil {
		return errRow{err: err}
	}
	return br.l.newRow(br.br.QueryRow(), false)
}

func (br *leaseBatch) Close() error {
	if br.closed {
		return br.err
	}
	br.closed = true
	if br.l.stale(br.gen) {
		br.err = ErrReleased
		return br.err
	}
	br.err = br.l.fail(br.br.Close())
	if br.release {
		br.l.release(br.gen)
	}
	return br.err
}

func (br *leaseBatch) Tx() pgx.Tx {
	if br.tx != nil {
		return br.tx
	}
	// A held connection's or transaction's batch: its owner holds the lease, and the
	// transaction, like the connection's own calls, never reaches the connection after Release.
	if br.heldTx == nil {
		t := br.br.Tx()
		if t == nil {
			return nil
		}
		if br.l.stale(br.gen) {
			// Its calls refuse (ErrReleased); the lease's slabs are its new holder's.
			br.heldTx = &leaseTx{t: t, l: br.l, gen: br.gen}
		} else {
			br.heldTx = br.l.newTx(t, false)
		}
	}
	return br.heldTx
}
