package stdlib_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	pgxstdlib "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// scanAll returns every value of every row of query as database/sql hands them to Scan(&any),
// and the column types.
func scanAll(t *testing.T, db *sql.DB, query string, args ...any) ([][]any, []*sql.ColumnType) {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), query, args...)
	require.NoError(t, err)
	defer rows.Close()
	types, err := rows.ColumnTypes()
	require.NoError(t, err)
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(types))
		ptrs := make([]any, len(types))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		out = append(out, vals)
	}
	require.NoError(t, rows.Err())
	return out, types
}

// The common types come out of database/sql exactly as they do through pgx's stdlib on a
// pgxpool: the same driver values and the same column types, for results and for arguments.
func TestTypesLikePgxStdlib(t *testing.T) {
	ctx := context.Background()
	dsn := pgserver.NewDatabase(t)
	lanesPool, err := pgxlanes.New(ctx, dsn)
	require.NoError(t, err)
	defer lanesPool.Close()
	lanes := stdlib.OpenDBFromPool(lanesPool)
	defer lanes.Close()
	plainPool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer plainPool.Close()
	plain := pgxstdlib.OpenDBFromPool(plainPool)
	defer plain.Close()

	ts := time.Date(2024, 2, 29, 13, 14, 15, 123456000, time.UTC)
	cases := []struct {
		name  string
		query string
		args  []any
		want  []any // what our driver hands to Scan(&any); nil: only compare with pgx
	}{
		{"int2 int4 int8", "select 1::int2, 2::int4, 3::int8", nil, []any{int64(1), int64(2), int64(3)}},
		{"text varchar char", "select 'a'::text, 'b'::varchar(5), 'c'::char(3)", nil, []any{"a", "b", "c  "}},
		{"bool", "select true, false", nil, []any{true, false}},
		{"float4 float8", "select 1.5::float4, 2.25::float8", nil, []any{1.5, 2.25}},
		{"numeric", "select 12.345::numeric(10,3), 'NaN'::numeric", nil, []any{"12.345", "NaN"}},
		{"timestamptz", "select '2024-02-29 13:14:15.123456+00'::timestamptz", nil, nil},
		{"timestamp date", "select '2024-02-29 13:14:15'::timestamp, '2024-02-29'::date", nil, nil},
		{"bytea", `select '\x00ff10'::bytea`, nil, []any{[]byte{0, 0xff, 0x10}}},
		{"uuid", "select 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid", nil, []any{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}},
		{"json jsonb", `select '{"a": 1}'::json, '{"b": [2]}'::jsonb`, nil, []any{[]byte(`{"a": 1}`), []byte(`{"b": [2]}`)}},
		{"arrays", "select '{1,2,3}'::int8[], '{a,NULL}'::text[]", nil, []any{"{1,2,3}", "{a,NULL}"}},
		{"null", "select null::int, null::text, null::timestamptz", nil, []any{nil, nil, nil}},
		{"oid interval inet", "select 26::oid, '1 day 2 hours'::interval, '10.0.0.1/8'::inet", nil, nil},
		{"arguments", "select $1::int8, $2::text, $3::bool, $4::float8, $5::numeric, $6::timestamptz, $7::bytea, $8::uuid, $9::jsonb, $10::int8[]",
			[]any{int64(-7), "héllo", true, 0.5, "1.10", ts, []byte{1, 2}, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", []byte(`{"k":"v"}`), []int64{4, 5}},
			[]any{int64(-7), "héllo", true, 0.5, "1.10", nil, []byte{1, 2}, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", []byte(`{"k": "v"}`), "{4,5}"}},
		{"empty result", "select 1::int4, 'x'::text where false", nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, gotTypes := scanAll(t, lanes, c.query, c.args...)
			want, wantTypes := scanAll(t, plain, c.query, c.args...)
			assert.Equal(t, want, got, "values as pgx's stdlib gives them")
			require.Len(t, gotTypes, len(wantTypes))
			for i := range wantTypes {
				g, w := gotTypes[i], wantTypes[i]
				assert.Equal(t, w.DatabaseTypeName(), g.DatabaseTypeName(), "column %d", i)
				assert.Equal(t, w.ScanType(), g.ScanType(), "column %d", i)
				gl, gok := g.Length()
				wl, wok := w.Length()
				assert.Equal(t, [2]any{wl, wok}, [2]any{gl, gok}, "column %d length", i)
				gp, gs, gok := g.DecimalSize()
				wp, ws, wok := w.DecimalSize()
				assert.Equal(t, [3]any{wp, ws, wok}, [3]any{gp, gs, gok}, "column %d decimal size", i)
			}
			if c.want != nil {
				require.Len(t, got, 1)
				for i, w := range c.want {
					if w != nil {
						assert.Equal(t, w, got[0][i], "column %d", i)
					}
				}
			}
		})
	}

	// Typed destinations, and PostgreSQL arrays through pgtype.Map.SQLScanner.
	var (
		n    int
		s    string
		b    bool
		f    float64
		tm   time.Time
		raw  []byte
		ns   sql.NullString
		ints []int64
	)
	m := pgtype.NewMap()
	err = lanes.QueryRowContext(ctx, `select 42, 'text', true, 2.5::float8, $1::timestamptz, '\xbeef'::bytea, null::text, '{7,8}'::int8[]`, ts).
		Scan(&n, &s, &b, &f, &tm, &raw, &ns, m.SQLScanner(&ints))
	require.NoError(t, err)
	assert.Equal(t, 42, n)
	assert.Equal(t, "text", s)
	assert.True(t, b)
	assert.Equal(t, 2.5, f)
	assert.True(t, ts.Equal(tm), "timestamptz: %v", tm)
	assert.Equal(t, []byte{0xbe, 0xef}, raw)
	assert.False(t, ns.Valid)
	assert.Equal(t, []int64{7, 8}, ints)
	assert.Equal(t, 0, lanesPool.Stat().Lane(pgxlanes.Short).InUse)
}
