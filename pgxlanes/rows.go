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

// poolRows holds its lease until Close, or until Next returns false, or Scan or Values fail.
// Rows report most server errors (a lock timeout, a cancel) only when read to the end, so Close
// looks for a lock timeout to blame, and Err translates errors once the guard acted on the lease.
type poolRows struct {
	r      pgx.Rows
	l      *lease
	closed bool
}

func (rows *poolRows) Close() {
	if rows.closed {
		return
	}
	rows.closed = true
	rows.r.Close()
	if err := rows.r.Err(); err != nil {
		rows.l.p.blameLockTimeout(rows.l, err)
	}
	rows.l.release()
}

func (rows *poolRows) Err() error                    { return rows.l.wrap(rows.r.Err()) }
func (rows *poolRows) CommandTag() pgconn.CommandTag { return rows.r.CommandTag() }
func (rows *poolRows) FieldDescriptions() []pgconn.FieldDescription {
	return rows.r.FieldDescriptions()
}
func (rows *poolRows) RawValues() [][]byte  { return rows.r.RawValues() }
func (rows *poolRows) Conn() *pgx.Conn      { return rows.r.Conn() }
func (rows *poolRows) TypeMap() *pgtype.Map { return rows.r.TypeMap() }

func (rows *poolRows) Next() bool {
	n := rows.r.Next()
	if !n {
		rows.Close()
	}
	return n
}

func (rows *poolRows) Scan(dest ...any) error {
	err := rows.r.Scan(dest...)
	if err != nil {
		rows.Close()
	}
	return err
}

func (rows *poolRows) Values() ([]any, error) {
	values, err := rows.r.Values()
	if err != nil {
		rows.Close()
	}
	return values, err
}

// poolRow releases its lease when Scan returns, or panics.
type poolRow struct {
	r pgx.Row
	l *lease
}

func (row *poolRow) Scan(dest ...any) error {
	defer row.l.release()
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
	return &budgetRows{Rows: rows, l: br.l}, nil
}

func (br *poolBatchResults) QueryRow() pgx.Row {
	br.next()
	return budgetRow{r: br.br.QueryRow(), l: br.l}
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
