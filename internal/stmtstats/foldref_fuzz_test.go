package stmtstats

import (
	"fmt"
	"hash/maphash"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// foldSeeds: every TestFold case and FuzzFold seed, and texts aimed at the fast loop's edges:
// two spaces at every offset mod 8, tabs, unterminated strings, comments and quoted names,
// dollar quotes, parameters, names with digits, signed and odd numbers, lists, bytes ≥ 0x80.
func foldSeeds() []string {
	s := []string{
		// TestFold.
		"select 1", "  select\n\t1 ;  ", "select * from t where id = 42",
		"select * from t where id = -3.5e-2 and a-1 > 0", "select * from t1 where c2 = 0x1F and c3 = 1_000",
		"select * from t where d > '2026-11-25' and n = 'it''s'", `select E'a\'b', $$x$$, $tag$ y $ $tag$`,
		"select * from t where id in (1, 2, 3)", "select * from t where id in (4)",
		"select * from t where id in ($1,$2,$3) and x = $4", "select * from t where s in ('a', 'b' /* c */, -- d\n 'e')",
		"select f(a, 1) from t", "select /* hint 7 */ a -- trailing 8\nfrom t", `select "col 1", "t""2" from t`,
		"select pg_sleep(1.5)", "select a$1 from t", "", "'unterminated", "/* unterminated", `select "unterminated `,
		"select a,  b ,\tc --x\n, d  ", "select .5, t.1, a.b, x.5", "a 0B.00000", "A00000 .0B0000000",
		"éé", "select * from t where id = 1",
		// FuzzFold.
		"select * from t where id in (1,2) and s = 'x'", "$a$ $$", "/* /* */", "E'\\'", "((1,", "\"  ",
		strings.Repeat("select a,  b -- c\n from t where x = 'y' and z in (1, 2) ", 8), `select "a ` + strings.Repeat("x", 300),
		// Edges.
		"select\ta\tfrom\tt", "select 'abc", "select $$abc", "select $t$abc $t", `select "abc`, "select -- x", "select /* x",
		"select $1, $22 from t", "select t1, a2b, x_3 from t2", "select -1, +2, a - 3, a-4, (-5), x*-6, 'a'-7, \"q\"+8, f(1)-9",
		"select a[1]-1, a[$1] +2, x /* c */ -3, x /**/+4, a*/-5, /* c */ -6, ( /* c */ +7) from t",
		"select .5, 1e-3, 1E+4, 1e, 1.e5, 0x1F, 0o17, 0b101, 1_000.000_1, 1..2", "select (1), (1,2), (1, 'a', $1, -2, E'x'), (a, 1), ((1)), ()",
		"select 'é', \"ü\", ñ1 from t€ where x = '日本' and y = 1", "select \xff\x80 1", "x  ", "  x", " ", "  ", "a -- b\n  c",
		"a /* b */  c", "in ( 1 , 2 )", "in (1,\t2)", "select e'\\'', E'x'", "select U&'x'", "a$$", "$1$", "$a", "$_$x$_$",
		strings.Repeat("select col1, col2 from tab where a = $1 and ", 10),
		strings.Repeat("abcdefgh", 30) + " 1 " + strings.Repeat("x ", 100),
	}
	for off := range 16 {
		base := []byte(strings.Repeat("select a, b from tbl where c = d ", 2))
		t := []byte(string(base[:off]) + "  " + string(base[off:]))
		s = append(s, string(t), strings.ReplaceAll(string(t), "  ", " \t"), strings.ReplaceAll(string(t), "  ", "\t "))
		s = append(s, strings.Repeat("x", off)+"  1", strings.Repeat("x", off)+" -- c\n1", strings.Repeat("é", off)+"  (1, 2)")
	}
	return s
}

// FuzzFoldMatchesReference: the folder writes exactly what the reference (the folder before it
// was made faster, foldref_test.go) writes, and hashes it to the same key, for every input.
func FuzzFoldMatchesReference(f *testing.F) {
	for _, s := range foldSeeds() {
		f.Add(s)
	}
	seed := maphash.MakeSeed()
	f.Fuzz(func(t *testing.T, s string) {
		got, want := Fold(s, len(s)+8), refFold(s, len(s)+8)
		if got != want {
			t.Fatalf("Fold(%q) = %q, reference %q", s, got, want)
		}
		if got, want := Fold(s, len(s)/2), refFold(s, len(s)/2); got != want { // cut short
			t.Fatalf("Fold(%q, %d) = %q, reference %q", s, len(s)/2, got, want)
		}
		if len(got) > len(s) { // foldHash relies on it: a text shorter than the sink's buffer never spills
			t.Fatalf("Fold(%q) = %q is longer than the text", s, got)
		}
		if got, want := foldHash(seed, s), refFoldHash(seed, s); got != want {
			t.Fatalf("foldHash(%q) = %x, reference %x (folded %q)", s, got, want, refFold(s, len(s)+8))
		}
	})
}

// TestFoldHashAllocatesNothing: short and long texts, with and without literals, a fold that is a
// piece of the text and one that spills its buffer into the hash.
func TestFoldHashAllocatesNothing(t *testing.T) {
	seed := maphash.MakeSeed()
	for _, s := range []string{"select 1", " select a from t ", strings.Repeat("select a, b from t where c = $1 ", 12),
		strings.Repeat("select a, b from t where c = 'x' and d in (1, 2) ", 12)} {
		require.Zero(t, testing.AllocsPerRun(100, func() { foldHash(seed, s) }), "%q", s)
		require.Equal(t, maphash.String(seed, Fold(s, len(s))), foldHash(seed, s), "%q", s)
	}
}

// naivePlainRun is plainRun a byte at a time.
func naivePlainRun(s string, i int) int {
	for ; i < len(s); i++ {
		if classOf[s[i]] != cPlain || s[i] == ' ' && i+1 < len(s) && s[i+1] == ' ' {
			return i
		}
	}
	return i
}

// TestPlainRun: plainRun stops where a byte-at-a-time loop stops, for every byte at every
// offset of a word, and for two spaces across the words' edges.
func TestPlainRun(t *testing.T) {
	for n := 1; n <= 26; n++ {
		for at := range n {
			for c := range 256 {
				b := []byte(strings.Repeat("abc,e.g)", 4)[:n])
				b[at] = byte(c)
				for from := range min(at, 8) + 1 { // every offset of the byte in a word
					if want, got := naivePlainRun(string(b), from), plainRun(string(b), from); got != want {
						t.Fatalf("plainRun(%q, %d) = %d, want %d", b, from, got, want)
					}
				}
			}
			b := []byte(strings.Repeat("a b", 9)[:n])
			b[at] = ' '
			if at+1 < n {
				b[at+1] = ' '
			}
			for from := range at + 1 {
				require.Equal(t, naivePlainRun(string(b), from), plainRun(string(b), from), "%q from %d", b, from)
			}
		}
	}
}

// keyBenchTexts are the texts of BenchmarkKey and BenchmarkFoldHash, by BenchmarkKey's names:
// 40, 90 (no literal) and 99 bytes (3 literals and a list; named 90), and 277 bytes (named 300).
var keyBenchTexts = []struct{ Name, SQL string }{
	{"Len=40/Literals=0", "select name from users where id = $1"},
	{"Len=90/Literals=0", "select id, name, email, created_at from users where tenant = $1 and id = $2 order by id"},
	{"Len=90/Literals=3", "select id, name, email from users where tenant = 42 and created_at > '2026-11-25' and id in (1,2,3)"},
	{"Len=300/Literals=0", "select o.id, o.total, o.state, o.created_at, o.updated_at, u.name, u.email, u.created_at, o.note, o.ref, o.channel, o.currency, o.discount, o.tax, o.shipping from orders o join users u on u.id = o.user_id where o.tenant = $1 and o.state = $2 order by o.created_at desc limit $3"},
}

// copiesOf returns n copies of s, each at an address of its own: texts built per call.
func copiesOf(s string, n int) []string {
	copies := make([]string, n)
	for i := range copies {
		copies[i] = strings.Clone(s)
	}
	return copies
}

// BenchmarkFoldHash: foldHash against the reference (the folder before it was made faster), in
// one binary, on the texts of BenchmarkKey, each call on a copy at a new address (as
// Hash=folded-uncached). Compare with: benchstat -col /Impl.
func BenchmarkFoldHash(b *testing.B) {
	seed := maphash.MakeSeed()
	for _, t := range keyBenchTexts {
		copies := copiesOf(t.SQL, 4096)
		for _, impl := range []string{"reference", "current"} {
			f := foldHash
			if impl == "reference" {
				f = refFoldHash
			}
			b.Run(fmt.Sprintf("Len=%d/Impl=%s", len(t.SQL), impl), func(b *testing.B) {
				i := 0
				for b.Loop() {
					foldHashSink ^= f(seed, copies[i%len(copies)])
					i++
				}
			})
		}
	}
}

var foldHashSink uint64
