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

// leaseRows are the rows of a query on a lease. Rows report most server errors (a lock timeout,
// a cancel) only when read to the end, so Close looks for a lock timeout to blame, and Err
// translates errors once the guard acted on the lease. The rows of a pool query (release) also
// hold their lease until they end: at Close, when Next returns false, or when Scan or Values
// fail. Those of a transaction, held connection or batch leave it to its owner.
type leaseRows struct {
	pgx.Rows
	l       *lease
	release bool
	closed  bool
}

func (r *leaseRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	if err := r.Rows.Err(); err != nil {
		r.l.p.blameLockTimeout(r.l, err)
	}
	if r.release {
		r.l.release()
	}
}

func (r *leaseRows) Err() error { return r.l.wrap(r.Rows.Err()) }

func (r *leaseRows) Next() bool {
	n := r.Rows.Next()
	if !n {
		r.Close() // pgx has closed them already; this blames and releases once
	}
	return n
}

func (r *leaseRows) Scan(dest ...any) error {
	err := r.Rows.Scan(dest...)
	if err != nil {
		r.Close()
	}
	return err
}

func (r *leaseRows) Values() ([]any, error) {
	values, err := r.Rows.Values()
	if err != nil {
		r.Close()
	}
	return values, err
}

// leaseRow is the row of a QueryRow on a lease: Scan blames a lock timeout and translates errors
// once the guard acted on the lease. A pool QueryRow's row (release) gives the lease back when
// Scan returns, or panics.
type leaseRow struct {
	r       pgx.Row
	l       *lease
	release bool
}

func (row *leaseRow) Scan(dest ...any) error {
	if row.release {
		defer row.l.release()
	}
	err := row.r.Scan(dest...)
	if err != nil {
		row.l.p.blameLockTimeout(row.l, err)
	}
	return row.l.wrap(err)
}

// poolBatchResults are the results of a batch sent on a lease: by the pool, by a transaction or
// on a held connection. A pool batch releases its lease at Close, unless it began a transaction,
// which then owns the lease and releases it on Commit or Rollback.
type poolBatchResults struct {
	br      pgx.BatchResults
	l       *lease
	release bool    // Close releases l
	tx      *poolTx // the pool batch's transaction, or nil
	// hidden is the number of pgxlanes' own queries (the transaction's settings, see SendBatch)
	// queued after the first one, and reads counts the caller's reads, so that their results are
	// read and dropped before the caller's second read.
	hidden int
	reads  int
}

// next skips the hidden results when the caller's next read would get them. Their errors are
// dropped: pgx gives the caller's own read the batch's error, and that read must be made anyway,
// since in some exec modes each failed read still takes its query's turn.
func (br *poolBatchResults) next() {
	if br.reads == 1 {
		for ; br.hidden > 0; br.hidden-- {
			_, _ = br.br.Exec()
		}
	}
	br.reads++
}

// Exec, Query, QueryRow and Close blame a lock timeout and translate errors once the guard acted
// on the lease, as the pool's own calls do.
func (br *poolBatchResults) Exec() (pgconn.CommandTag, error) {
	br.next()
	ct, err := br.br.Exec()
	return ct, br.fail(err)
}

func (br *poolBatchResults) Query() (pgx.Rows, error) {
	br.next()
	rows, err := br.br.Query()
	if err != nil {
		err = br.fail(err)
		return errRows{err: err}, err
	}
	return &leaseRows{Rows: rows, l: br.l}, nil
}

func (br *poolBatchResults) QueryRow() pgx.Row {
	br.next()
	return &leaseRow{r: br.br.QueryRow(), l: br.l}
}

func (br *poolBatchResults) Close() error {
	err := br.br.Close()
	if br.release {
		br.l.release()
	}
	return br.fail(err)
}

func (br *poolBatchResults) fail(err error) error {
	if err == nil {
		return nil
	}
	br.l.p.blameLockTimeout(br.l, err)
	return br.l.wrap(err)
}

func (br *poolBatchResults) Tx() pgx.Tx {
	if br.tx == nil {
		return br.br.Tx() // a held connection's batch: the connection's owner holds the lease
	}
	return br.tx
}
