package stdlib

// The conversion of PostgreSQL values to driver.Value and the ColumnType methods are pgx's
// (github.com/jackc/pgx/v5/stdlib, v5.12.0), which does not export them:
//
// Copyright (c) 2013-2021 Jack Christensen
//
// MIT License
//
// Permission is hereby granted, free of charge, to any person obtaining a copy of this software
// and associated documentation files (the "Software"), to deal in the Software without
// restriction, including without limitation the rights to use, copy, modify, merge, publish,
// distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
// Software is furnished to do so, subject to the following conditions:
//
// The above copyright notice and this permission notice shall be included in all copies or
// substantial portions of the Software.
//
// THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
// BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
// NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
// DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
// OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.

import (
	"database/sql/driver"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// databaseSQLResultFormats asks for the binary format of the types database/sql has a Go type
// for, as pgx's stdlib does; the others come as text.
var databaseSQLResultFormats = pgx.QueryResultFormatsByOID{
	pgtype.BoolOID:        1,
	pgtype.ByteaOID:       1,
	pgtype.CIDOID:         1,
	pgtype.DateOID:        1,
	pgtype.Float4OID:      1,
	pgtype.Float8OID:      1,
	pgtype.Int2OID:        1,
	pgtype.Int4OID:        1,
	pgtype.Int8OID:        1,
	pgtype.OIDOID:         1,
	pgtype.TimestampOID:   1,
	pgtype.TimestamptzOID: 1,
	pgtype.XIDOID:         1,
}

type rowValueFunc func(src []byte) (driver.Value, error)

// Rows are the rows of a query as database/sql sees them. The rows of an unpinned connection
// hold their lease until they are closed or read to the end; after that they never touch the
// connection again (the column types were resolved while it was held).
type Rows struct {
	rows         pgx.Rows
	types        []*pgtype.Type // per column; nil for an OID the connection's type map does not know
	valueFuncs   []rowValueFunc
	skipNext     bool
	skipNextMore bool
	columnNames  []string
	// fds are the rows' field descriptions, copied while the lease is surely held: pgconn reuses
	// its own for the connection's next statement, and database/sql asks for the columns after
	// the rows were read to the end (an empty result ends, and releases its lease, in newRows).
	fds []pgconn.FieldDescription
}

// newRows resolves the column types while the lease is surely held, and reads the first row so
// that an error of the statement is returned by QueryContext.
func newRows(rows pgx.Rows) (*Rows, error) {
	r := &Rows{rows: rows, skipNext: true}
	fds := slices.Clone(rows.FieldDescriptions())
	r.fds = fds
	if conn := rows.Conn(); conn != nil && len(fds) > 0 {
		m := conn.TypeMap()
		r.types = make([]*pgtype.Type, len(fds))
		for i, fd := range fds {
			r.types[i], _ = m.TypeForOID(fd.DataTypeOID)
		}
	}
	r.skipNextMore = rows.Next()
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, badConn(err)
	}
	return r, nil
}

func (r *Rows) Columns() []string {
	if r.columnNames == nil {
		fields := r.fds
		r.columnNames = make([]string, len(fields))
		for i, fd := range fields {
			r.columnNames[i] = fd.Name
		}
	}
	return r.columnNames
}

// ColumnTypeDatabaseTypeName returns the database system type name. If the name is unknown the
// OID is returned.
func (r *Rows) ColumnTypeDatabaseTypeName(index int) string {
	if index < len(r.types) && r.types[index] != nil {
		return strings.ToUpper(r.types[index].Name)
	}
	return strconv.FormatInt(int64(r.fds[index].DataTypeOID), 10)
}

const varHeaderSize = 4

// ColumnTypeLength returns the length of the column type if the column is a variable length
// type. If the column is not a variable length type ok should return false.
func (r *Rows) ColumnTypeLength(index int) (int64, bool) {
	fd := r.fds[index]
	switch fd.DataTypeOID {
	case pgtype.TextOID, pgtype.ByteaOID:
		return math.MaxInt64, true
	case pgtype.VarcharOID, pgtype.BPCharOID:
		return int64(fd.TypeModifier - varHeaderSize), true
	case pgtype.VarbitOID:
		return int64(fd.TypeModifier), true
	default:
		return 0, false
	}
}

// ColumnTypePrecisionScale returns the precision and scale of a numeric column. If not
// applicable, ok is false.
func (r *Rows) ColumnTypePrecisionScale(index int) (precision, scale int64, ok bool) {
	fd := r.fds[index]
	switch fd.DataTypeOID {
	case pgtype.NumericOID:
		mod := fd.TypeModifier - varHeaderSize
		return int64((mod >> 16) & 0xffff), int64(mod & 0xffff), true
	default:
		return 0, 0, false
	}
}

// ColumnTypeScanType returns the value type that can be used to scan types into.
func (r *Rows) ColumnTypeScanType(index int) reflect.Type {
	switch r.fds[index].DataTypeOID {
	case pgtype.Float8OID:
		return reflect.TypeFor[float64]()
	case pgtype.Float4OID:
		return reflect.TypeFor[float32]()
	case pgtype.Int8OID:
		return reflect.TypeFor[int64]()
	case pgtype.Int4OID:
		return reflect.TypeFor[int32]()
	case pgtype.Int2OID:
		return reflect.TypeFor[int16]()
	case pgtype.BoolOID:
		return reflect.TypeFor[bool]()
	case pgtype.NumericOID:
		return reflect.TypeFor[float64]()
	case pgtype.DateOID, pgtype.TimestampOID, pgtype.TimestamptzOID:
		return reflect.TypeFor[time.Time]()
	case pgtype.ByteaOID:
		return reflect.TypeFor[[]byte]()
	default:
		return reflect.TypeFor[string]()
	}
}

// Close closes the rows, which releases the lease of an unpinned connection.
func (r *Rows) Close() error {
	r.rows.Close()
	return r.rows.Err()
}

func (r *Rows) Next(dest []driver.Value) error {
	more := r.skipNextMore
	if r.skipNext {
		r.skipNext = false
	} else {
		more = r.rows.Next()
	}
	if !more {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	if r.valueFuncs == nil {
		r.initValueFuncs() // a row is here, so the lease is held
	}
	for i, rv := range r.rows.RawValues() {
		if rv == nil {
			dest[i] = nil
			continue
		}
		var err error
		if dest[i], err = r.valueFuncs[i](rv); err != nil {
			return fmt.Errorf("convert field %d failed: %w", i, err)
		}
	}
	return nil
}

// initValueFuncs prepares the database/sql representation of each column, as pgx's stdlib does.
func (r *Rows) initValueFuncs() {
	m := r.rows.Conn().TypeMap()
	fds := r.fds
	r.valueFuncs = make([]rowValueFunc, len(fds))
	for i, fd := range fds {
		switch fd.DataTypeOID {
		case pgtype.BoolOID:
			r.valueFuncs[i] = valueFunc(m, fd, func(d bool) (driver.Value, error) { return d, nil })
		case pgtype.ByteaOID, pgtype.JSONOID, pgtype.JSONBOID, pgtype.XMLOID:
			r.valueFuncs[i] = valueFunc(m, fd, func(d []byte) (driver.Value, error) { return d, nil })
		case pgtype.CIDOID, pgtype.OIDOID, pgtype.XIDOID:
			r.valueFuncs[i] = valueFunc(m, fd, pgtype.Uint32.Value)
		case pgtype.DateOID:
			r.valueFuncs[i] = valueFunc(m, fd, pgtype.Date.Value)
		case pgtype.Float4OID:
			r.valueFuncs[i] = valueFunc(m, fd, func(d float32) (driver.Value, error) { return float64(d), nil })
		case pgtype.Float8OID:
			r.valueFuncs[i] = valueFunc(m, fd, func(d float64) (driver.Value, error) { return d, nil })
		case pgtype.Int2OID:
			r.valueFuncs[i] = valueFunc(m, fd, func(d int16) (driver.Value, error) { return int64(d), nil })
		case pgtype.Int4OID:
			r.valueFuncs[i] = valueFunc(m, fd, func(d int32) (driver.Value, error) { return int64(d), nil })
		case pgtype.Int8OID:
			r.valueFuncs[i] = valueFunc(m, fd, func(d int64) (driver.Value, error) { return d, nil })
		case pgtype.TimestampOID:
			r.valueFuncs[i] = valueFunc(m, fd, pgtype.Timestamp.Value)
		case pgtype.TimestamptzOID:
			r.valueFuncs[i] = valueFunc(m, fd, pgtype.Timestamptz.Value)
		default:
			r.valueFuncs[i] = valueFunc(m, fd, func(d string) (driver.Value, error) { return d, nil })
		}
	}
}

// valueFunc scans a column into a T with the connection's scan plan and converts it.
func valueFunc[T any](m *pgtype.Map, fd pgconn.FieldDescription, conv func(T) (driver.Value, error)) rowValueFunc {
	var d T
	plan := m.PlanScan(fd.DataTypeOID, fd.Format, &d)
	return func(src []byte) (driver.Value, error) {
		if err := plan.Scan(src, &d); err != nil {
			return nil, err
		}
		return conv(d)
	}
}

var (
	_ driver.RowsColumnTypeDatabaseTypeName = (*Rows)(nil)
	_ driver.RowsColumnTypeLength           = (*Rows)(nil)
	_ driver.RowsColumnTypePrecisionScale   = (*Rows)(nil)
	_ driver.RowsColumnTypeScanType         = (*Rows)(nil)
)
