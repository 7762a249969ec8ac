package stmtstats_test

import (
	"hash/maphash"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

func TestFold(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"select 1", "select ?"},
		{"  select\n\t1 ;  ", "select ? ;"},
		{"select * from t where id = 42", "select * from t where id = ?"},
		{"select * from t where id = -3.5e-2 and a-1 > 0", "select * from t where id = ? and a-? > ?"},
		{"select * from t1 where c2 = 0x1F and c3 = 1_000", "select * from t1 where c2 = ? and c3 = ?"},
		{"select * from t where d > '2026-11-25' and n = 'it''s'", "select * from t where d > ? and n = ?"},
		{`select E'a\'b', $$x$$, $tag$ y $ $tag$`, "select E?, ?, ?"},
		{"select * from t where id in (1, 2, 3)", "select * from t where id in (?)"},
		{"select * from t where id in (4)", "select * from t where id in (?)"},
		{"select * from t where id in ($1,$2,$3) and x = $4", "select * from t where id in (?) and x = $4"},
		{"select * from t where s in ('a', 'b' /* c */, -- d\n 'e')", "select * from t where s in (?)"},
		{"select f(a, 1) from t", "select f(a, ?) from t"},
		{"select /* hint 7 */ a -- trailing 8\nfrom t", "select a from t"},
		{`select "col 1", "t""2" from t`, `select "col 1", "t""2" from t`},
		{"select pg_sleep(1.5)", "select pg_sleep(?)"},
		{"select a$1 from t", "select a$1 from t"},
		{"", ""},
		{"'unterminated", "?"},
		{"/* unterminated", ""},
		{`select "unterminated `, `select "unterminated `}, // the space is the name's
		{"select a,  b ,\tc --x\n, d  ", "select a, b , c , d"},
		{"select .5, t.1, a.b, x.5", "select ?, t.?, a.b, x.?"},
		{"a 0B.00000", "a ??"}, {"A00000 .0B0000000", "A00000 ?B0000000"}, // a dot after a number starts one
		// A sign after an operand is an operator: it stays, and the number after it folds alone.
		{"select a[1]-1, a[$1]+2 from t", "select a[?]-?, a[$1]+? from t"},
		// After a block comment the sign stays too (what the comment follows is not looked at).
		{"select x /* c */ -1 from t", "select x -? from t"},
		{"select x -- c.\n-1 from t", "select x -? from t"},
	} {
		assert.Equal(t, tt.want, stmtstats.Fold(tt.in, 1000), "%q", tt.in)
	}
	assert.Equal(t, "select * from…", stmtstats.Fold("select * from t where id = 1", 13))
	assert.Equal(t, "é…", stmtstats.Fold("éé", 3), "a rune is never cut")
	// Only the bytes of the rune the cut splits are dropped, never a whole rune before it.
	assert.Equal(t, "€€…", stmtstats.Fold("€€x", 6))
	assert.Equal(t, "€…", stmtstats.Fold("€€x", 5))
	assert.Equal(t, "select ? from ünïcödé_ta…", stmtstats.Fold("select 'é' from ünïcödé_table", 28))
	assert.Equal(t, "a😀…", stmtstats.Fold("a😀😀", 8), "a 4-byte rune cut after 3 bytes")
	assert.Equal(t, "a😀…", stmtstats.Fold("a😀😀", 5))
	assert.Equal(t, "\xff\x80…", stmtstats.Fold("\xff\x80\x80", 2), "bytes that are not UTF-8 are kept")
}

func TestKeyFoldsLiterals(t *testing.T) {
	tab := newTable(t, 0)
	same := [][]string{
		{"select * from orders where created_at > '2026-11-25' and total > 100",
			"select * from orders where created_at > '2025-01-01' and total > 7.5",
			"select  *  from orders /* report */ where created_at > '1999-12-31'\n and total > -1"},
		{"select * from t where id in (1,2,3)", "select * from t where id in (4)", "select * from t where id in (5, 6, 7, 8, 9, 10)",
			"select * from t where id in ($1, $2)"},
		{"select pg_sleep(1.5)", "select pg_sleep(1.6)", "select pg_sleep(0.25) -- tag"},
	}
	var keys []stmtstats.Key
	for _, group := range same {
		k := tab.Key(group[0])
		for _, s := range group[1:] {
			assert.Equal(t, k, tab.Key(s), "%q and %q", group[0], s)
		}
		keys = append(keys, k)
	}
	differ := []string{"select * from t where id = $1", "select * from t where id = $2", "select * from t1 where id = $1",
		"select * from t where ID = $1", `select * from "t1" where id = $1`,
		// A sign after a subscript or after a block comment is taken for an operator, not a
		// number's sign: subtraction and addition keep their own keys.
		"select a[1]-1 from t", "select a[1]+1 from t", "update t set n = a[$1]-1", "update t set n = a[$1]+1",
		"select x /* offset */ -1 from t", "select x /* offset */ +1 from t"}
	for i, a := range differ {
		for _, b := range differ[i+1:] {
			assert.NotEqual(t, tab.Key(a), tab.Key(b), "%q and %q", a, b)
		}
	}
	// So is a sign at the start of a line (the line before may end in a comment), after a form
	// feed, and after a number's trailing dot.
	for _, pair := range [][2]string{{"select x -- c.\n-1 from t", "select x -- c.\n+1 from t"},
		{"select x\f-1 from t", "select x\f+1 from t"}, {"select 5. -1", "select 5. +1"}} {
		assert.NotEqual(t, tab.Key(pair[0]), tab.Key(pair[1]), "%q and %q", pair[0], pair[1])
	}
	require.NotEqual(t, keys[0], keys[1])
	assert.Zero(t, testing.AllocsPerRun(100, func() { tab.Key(same[0][2]) }), "Key allocates nothing")
}

func FuzzFold(f *testing.F) {
	for _, s := range []string{"select 1", "select * from t where id in (1,2) and s = 'x'", "$a$ $$", "/* /* */", "E'\\'", "((1,"} {
		f.Add(s)
	}
	long := strings.Repeat("select a,  b -- c\n from t where x = 'y' and z in (1, 2) ", 8) // folds to over 192 bytes
	f.Add(long)
	f.Add(`select "a ` + strings.Repeat("x", 300))
	seed := maphash.MakeSeed()
	f.Fuzz(func(t *testing.T, s string) {
		folded := stmtstats.Fold(s, len(s)+8)
		// A text cut short is the folded text's start, without a rune cut in two: at most
		// utf8.UTFMax-1 bytes shorter than asked.
		n := len(folded) / 2
		if cut, ok := strings.CutSuffix(stmtstats.Fold(s, n), "…"); ok {
			assert.True(t, strings.HasPrefix(folded, cut), "Fold(%q, %d) = %q", s, n, cut)
			assert.GreaterOrEqual(t, len(cut), n-(utf8.UTFMax-1), "Fold(%q, %d) = %q", s, n, cut)
			assert.True(t, !utf8.ValidString(folded) || utf8.ValidString(cut), "Fold(%q, %d) = %q", s, n, cut)
		}
		// Folding is idempotent: the folded text is its own fold, and keys agree.
		assert.Equal(t, folded, stmtstats.Fold(folded, len(folded)+8))
		tab := newTable(t, 0)
		assert.Equal(t, tab.Key(s), tab.Key(folded))
		// The key hashes exactly the folded text, however long (its buffer spills into the hash).
		assert.Equal(t, maphash.String(seed, folded), stmtstats.FoldHash(seed, s))
	})
}

// BenchmarkKey: the key of a statement, folded, against a plain hash of the text (what the key
// cost before folding). Texts of 40, 90 and 300 bytes, with and without literals. Hash=folded
// keys the same string every call (a constant: the identity cache's hit). Hash=folded-rebuilt,
// Hash=folded-uncached and Hash=plain take a copy at a new address every call (a text built per
// call), from the same copies, so that all three read the text from the same place in memory:
// folded-rebuilt is the Table's key of such a text, the same text each time (the content cache's
// hit), folded-uncached the same with the content cache off, as for a text whose literals change
// on every call (folded every time). There are perCallCopies of them: a copy comes back only
// after every set of the identity cache has seen 32 other texts, so that the cache never takes it
// for a constant (with 4,096 copies, most came back while the cache still remembered their
// address, and were cached).
func BenchmarkKey(b *testing.B) {
	seed := maphash.MakeSeed()
	tab := newTable(b, 0)
	uncached := newTable(b, 0)
	stmtstats.NoContentCache(uncached)
	for _, t := range stmtstats.KeyBenchTexts {
		name, s := t.Name, t.SQL
		copies := stmtstats.CopiesOf(s, perCallCopies)
		b.Run(name+"/Hash=plain", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				keySink ^= maphash.String(seed, copies[i%len(copies)])
				i++
			}
		})
		b.Run(name+"/Hash=folded", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				keySink ^= uint64(tab.Key(s))
			}
		})
		for _, c := range []struct {
			hash string
			tab  *stmtstats.Table
		}{{"folded-rebuilt", tab}, {"folded-uncached", uncached}} {
			b.Run(name+"/Hash="+c.hash, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					keySink ^= uint64(c.tab.Key(copies[i%len(copies)]))
					i++
				}
			})
		}
	}
}

// BenchmarkLearnerPerCall: what the learner costs per call for a text built anew on every call,
// the whole step the pool takes: the key, Arrive, and Done of a fast run. Each call builds its
// text into a new string, as an ORM or a query builder does (so the text is in the CPU's cache,
// at a new address, and both keys pay the same build and allocation). Text=per-call has a
// different literal on every call (as ORMs that inline values build it), Text=rebuilt is the
// same parameterised text every call. Key=plain keys by a plain hash of the text, as the Table
// did before folding: each per-call text is a statement of its own, and each call puts a new
// entry in the Table. Key=folded is the Table's Key: one entry for all of them, the per-call
// text folded every call and the rebuilt one known by its content. Compare with:
// benchstat -col /Key.
func BenchmarkLearnerPerCall(b *testing.B) {
	texts := []struct {
		name  string
		build func(buf []byte, i int) []byte
	}{
		{"per-call", func(buf []byte, i int) []byte {
			buf = append(buf[:0], "select id, name, email from users where tenant = "...)
			buf = strconv.AppendInt(buf, int64(i), 10)
			buf = append(buf, " and created_at > '2026-11-"...)
			buf = strconv.AppendInt(buf, int64(10+i%19), 10)
			buf = append(buf, "' and id in ("...)
			for j := range 3 {
				if j > 0 {
					buf = append(buf, ',')
				}
				buf = strconv.AppendInt(buf, int64(i+j), 10)
			}
			return append(buf, ')')
		}},
		{"rebuilt", func(buf []byte, _ int) []byte {
			buf = append(buf[:0], "select id, name, email from users where tenant = "...)
			buf = append(buf, "$1"...)
			buf = append(buf, " and created_at > "...)
			buf = append(buf, "$2"...)
			buf = append(buf, " and id in ("...)
			for j := range 3 {
				if j > 0 {
					buf = append(buf, ',')
				}
				buf = append(buf, '$')
				buf = strconv.AppendInt(buf, int64(3+j), 10)
			}
			return append(buf, ')')
		}},
	}
	for _, text := range texts {
		for _, key := range []string{"plain", "folded"} {
			b.Run("Text="+text.name+"/Key="+key, func(b *testing.B) {
				tab := newTable(b, 0)
				seed := maphash.MakeSeed()
				buf := make([]byte, 0, 128)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					buf = text.build(buf, i)
					s := string(buf) // the text of this call
					i++
					var k stmtstats.Key
					if key == "plain" {
						k = stmtstats.Key(maphash.String(seed, s))
					} else {
						k = tab.Key(s)
					}
					tab.Arrive(k)
					tab.Done(k, fastRun, false)
				}
			})
		}
	}
}

var keySink uint64

// perCallCopies is how many texts at distinct addresses stand for texts built per call in
// BenchmarkKey: 32 per set of the key cache, whose sets remember their last 4 misses.
const perCallCopies = 1 << 15
