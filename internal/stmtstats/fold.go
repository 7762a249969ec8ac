package stmtstats

import (
	"encoding/binary"
	"hash/maphash"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Folding: texts that differ only in literals share a key. One loop walks the text once and
// writes it to a sink (fold): runs of the text as it is, and, in place of what it folds, a fixed
// piece:
//
//   - a number (42, 3.14, 1e6, 0x1F, 1_000) that is not part of a name: "?"
//   - a string ('it''s', E'\n', $$body$$, $tag$body$tag$): "?"
//   - a parenthesised list of only literals and parameters ((1, 2, 3), ('a','b'), ($1,$2)),
//     whatever its length: "(?)"
//   - a comment (-- to the end of the line, /* nested */) and a run of whitespace: one space,
//     none at the start or the end
//
// Names, quoted names ("t1"), parameters outside a list ($1) and everything else stay as they
// are. The key is the hash of what the loop writes (foldHash), the folded text is what it writes
// (Fold).

// What a byte may start, for the folder's loop.
const (
	cPlain = iota // nothing: it stays as it is
	cName         // a digit or $: part of a name after a name's byte, else a number or a parameter
	cSpace        // whitespace
	cOther        // may start a comment, a string, a number, a list or a quoted name: look closer
)

// classOf is the class of each byte. A space is cPlain: a single space between two things that
// stay is part of their run (plainRun stops at two spaces in a row).
var classOf = func() (t [256]uint8) {
	for _, c := range []byte("\t\n\r\f\v") {
		t[c] = cSpace
	}
	for _, c := range []byte("-/'(\"+") {
		t[c] = cOther
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = cName
	}
	t['$'] = cName
	return t
}()

// wordByte[c] is isWord(c), as a table for the loop.
var wordByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isWord(byte(c))
	}
	return t
}()

// foldSink takes the folded text in pieces. For a key it keeps the first piece where it is (a
// text that folds to a piece of itself, as most texts without literals do, is hashed in place),
// then fills buf and hashes it at the end (a text whose fold is longer than buf is hashed as
// buf fills); for Fold it appends to out.
type foldSink struct {
	n       int
	display bool   // append to out
	spilled bool   // h has taken some of the text
	first   string // the first piece, while it is all that was written (not yet in buf)
	seed    maphash.Seed
	out     []byte
	buf     [192]byte
}

// write writes " " (if space) and t, which is not empty.
func (o *foldSink) write(space bool, t string, h *maphash.Hash) {
	if o.n == 0 && !o.spilled && !o.display {
		if o.first == "" && !space {
			o.first = t
			return
		}
		o.copyFirst(h)
	}
	if o.n+len(t) < len(o.buf)-1 && !o.display {
		if space {
			o.buf[o.n] = ' '
			o.n++
		}
		o.n += copy(o.buf[o.n:], t)
		return
	}
	if space {
		o.writeSlow(" ", h)
	}
	o.writeSlow(t, h)
}

// writeFixed writes " " (if space), t (if not empty) and f (a fixed piece: "?" or "(?)"), as
// write does.
func (o *foldSink) writeFixed(space bool, t, f string, h *maphash.Hash) {
	n := o.n
	if n == 0 || n+len(t)+len(f) >= len(o.buf)-1 || o.display {
		if t != "" {
			o.write(space, t, h)
			space = false
		}
		o.write(space, f, h)
		return
	}
	if space {
		o.buf[n] = ' '
		n++
	}
	n += copy(o.buf[n:], t)
	for k := range len(f) {
		o.buf[n+k] = f[k]
	}
	o.n = n + len(f)
}

// copyFirst moves the first piece (if any) into buf, when another follows it.
func (o *foldSink) copyFirst(h *maphash.Hash) {
	t := o.first
	o.first = ""
	if len(t) < len(o.buf) {
		o.n = copy(o.buf[:], t)
		return
	}
	o.writeSlow(t, h)
}

// writeSlow writes t, hashing buf into h each time it fills.
func (o *foldSink) writeSlow(t string, h *maphash.Hash) {
	if o.display {
		o.out = append(o.out, t...)
		return
	}
	for len(t) > 0 {
		c := copy(o.buf[o.n:], t)
		o.n += c
		t = t[c:]
		if o.n == len(o.buf) {
			if !o.spilled {
				h.SetSeed(o.seed) // h is nil only for a text shorter than buf (see foldHash)
				o.spilled = true
			}
			h.Write(o.buf[:])
			o.n = 0
		}
	}
}

// sum returns the hash of everything written (maphash's hash does not depend on how the bytes
// were split between writes).
func (o *foldSink) sum(h *maphash.Hash) uint64 {
	if o.first != "" {
		return maphash.String(o.seed, o.first)
	}
	if !o.spilled {
		return maphash.Bytes(o.seed, o.buf[:o.n])
	}
	h.Write(o.buf[:o.n])
	return h.Sum64()
}

// fold writes the folded text of s to o in one pass. A run of bytes that stay as they are goes
// out in one piece, when something folded (or the end) comes after it. The loop stops only at
// bytes that may start something; a single space stays in the run, and is taken back out of it
// when it turns out to be part of a longer gap (a second space, a comment, the end).
func fold(s string, o *foldSink, h *maphash.Hash) {
	var (
		run      int  // s[run:i] is pending, as it is
		space    bool // whitespace or a comment was folded since the last output: " " before the next
		emitted  bool // something went out: whitespace after it counts
		prevWord bool // s[i-1] is part of a name, a number or a parameter
		lastSp   = -1 // where the last space taken as it is was (not one inside a quoted name)
	)
	flush := func(i int) {
		if i > run {
			o.write(space, s[run:i], h)
			space, emitted = false, true
		}
	}
	// gap folds the whitespace and comments from i on, with a space that ends the run.
	gap := func(i int) int {
		if i > run && lastSp == i-1 {
			flush(i - 1)
		} else {
			flush(i)
		}
		i = skipGap(s, i)
		run, space = i, emitted
		return i
	}
	// fixed puts f in place of s[i:end].
	fixed := func(i, end int, f string) int {
		o.writeFixed(space, s[run:i], f, h)
		space, emitted = false, true
		run = end
		return end
	}
	i := 0
	for i < len(s) {
		c := s[i]
		if c == ' ' {
			// A single space between two things that stay is its own fold: it stays in the run.
			if (i > run || emitted) && i+1 < len(s) && !gapStarts(s, i+1) {
				lastSp = i
				i++
			} else {
				i = gap(i)
			}
			prevWord = false
			continue
		}
		switch classOf[c] {
		case cPlain:
			// The common case: bytes that start nothing, eight at a time.
			i = plainRun(s, i+1)
			if s[i-1] == ' ' {
				lastSp = i - 1
			}
			prevWord = wordByte[s[i-1]]
			continue
		case cName:
			switch {
			case prevWord: // the digits and $ of a name
				i++
				for i < len(s) && (isDigit(s[i]) || s[i] == '$') {
					i++
				}
				continue
			case c == '$' && i+1 < len(s) && isDigit(s[i+1]): // $1 stays
				i += 2
				for i < len(s) && isDigit(s[i]) {
					i++
				}
				prevWord = true
				continue
			case c == '$':
				e, ok := skipDollarString(s, i)
				if !ok {
					i = skipParam(s, i) // $1 stays
					prevWord = true
					continue
				}
				i = fixed(i, e, "?")
			default:
				j := i
				if j > run && s[j-1] == '.' && (j-1 == run || !wordByte[s[j-2]]) {
					j-- // .5: the dot is the number's
				}
				i = fixed(j, skipNumber(s, j), "?")
			}
		case cSpace:
			i = gap(i)
		default: // cOther
			switch c {
			case '\'':
				i = fixed(i, skipString(s, i), "?")
			case '(':
				if e, ok := skipList(s, i); ok {
					i = fixed(i, e, "(?)")
				} else {
					i++
				}
			case '"':
				i = skipQuoted(s, i, '"')
			case '-', '/':
				switch {
				case gapStarts(s, i): // a comment
					i = gap(i)
				case c == '-' && unary(s, i):
					i = fixed(i, skipNumber(s, i+1), "?")
				default:
					i++
				}
			default: // +
				if unary(s, i) {
					i = fixed(i, skipNumber(s, i+1), "?")
				} else {
					i++
				}
			}
		}
		prevWord = false
	}
	// The end: what is pending goes out, without a space that ends it (gap at len(s)).
	if n := len(s); n > run && lastSp == n-1 {
		flush(n - 1)
	} else {
		flush(n)
	}
}

// stopPair[b0|b1<<8] describes the bytes b0 b1 for the loop's run: bit 0, one of them may start
// something (its class is not cPlain) or both are spaces (a gap starts); bit 1, b1 is a space;
// bit 2, b0 is a space (bits 1 and 2 find two spaces across two pairs).
var stopPair = func() (t *[1 << 16]uint8) {
	t = new([1 << 16]uint8)
	for p := range t {
		b0, b1 := byte(p), byte(p>>8)
		if classOf[b0] != cPlain || classOf[b1] != cPlain || b0 == ' ' && b1 == ' ' {
			t[p] |= 1
		}
		if b1 == ' ' {
			t[p] |= 2
		}
		if b0 == ' ' {
			t[p] |= 4
		}
	}
	return t
}()

// plainRun returns the index of the first byte from i on that may start something: one whose
// class is not cPlain, or the first of two spaces (a gap); len(s) if none. It reads eight bytes
// at a time as four pairs from one table, and the last bytes (or a word that may stop) one at a
// time.
func plainRun(s string, i int) int {
	t := stopPair
	var prev uint8 // the last pair of the word before
	for i+8 <= len(s) {
		v := binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[i:]), 8))
		a, b, c, d := t[uint16(v)], t[uint16(v>>16)], t[uint16(v>>32)], t[uint16(v>>48)]
		if (a|b|c|d)&1|(prev&(a>>1)|a&(b>>1)|b&(c>>1)|c&(d>>1))&2 != 0 {
			break
		}
		prev = d
		i += 8
	}
	if prev&2 != 0 {
		i-- // the space before the word may be the first of two
	}
	for ; i < len(s); i++ {
		if classOf[s[i]] != cPlain || s[i] == ' ' && i+1 < len(s) && s[i+1] == ' ' {
			return i
		}
	}
	return i
}

// gapStarts reports whether whitespace or a comment starts at s[i].
func gapStarts(s string, i int) bool {
	switch s[i] {
	case ' ', '\t', '\n', '\r', '\f', '\v':
		return true
	case '-':
		return i+1 < len(s) && s[i+1] == '-'
	case '/':
		return i+1 < len(s) && s[i+1] == '*'
	}
	return false
}

// foldHash hashes the folded text without building it, and without allocating.
func foldHash(seed maphash.Seed, sql string) uint64 {
	if len(sql) >= len(foldSink{}.buf) {
		return foldHashLong(seed, sql)
	}
	o := foldSink{seed: seed} // a fold is never longer than its text: buf holds it
	fold(sql, &o, nil)
	return o.sum(nil)
}

// foldHashLong is foldHash for a text whose fold may be longer than the sink's buf.
func foldHashLong(seed maphash.Seed, sql string) uint64 {
	var h maphash.Hash
	o := foldSink{seed: seed}
	fold(sql, &o, &h)
	return o.sum(&h)
}

// Fold returns the text as the Table keys it: literals, lists of literals, comments and
// whitespace folded, cut to at most n bytes (with "…" when cut). Use it to show a statement
// without the values it carried.
func Fold(sql string, n int) string {
	o := foldSink{display: true, out: make([]byte, 0, len(sql))}
	fold(sql, &o, nil)
	b := o.out
	if len(b) <= n {
		return string(b)
	}
	b = b[:n]
	// Do not cut a rune: drop the bytes of an incomplete last rune (at most utf8.UTFMax-1).
	for k := len(b) - 1; k >= max(len(b)-(utf8.UTFMax-1), 0); k-- {
		if utf8.RuneStart(b[k]) {
			if !utf8.FullRune(b[k:]) {
				b = b[:k]
			}
			break
		}
	}
	return string(b) + "…"
}

// unary reports whether the sign at s[i] starts a signed number: a digit follows, and what comes
// before it (whitespace aside) is not an operand (a name, a number, a parameter, a string, a
// quoted name, ')' or ']') nor the end of a block comment: an operator, a comma, '(', or nothing.
// Taking a sign for an operator is always safe (at worst two texts that could share a key do
// not); taking an operator for a sign would give a[1]-1 and a[1]+1 one key.
func unary(s string, i int) bool {
	if i+1 >= len(s) || !isDigit(s[i+1]) && !(s[i+1] == '.' && i+2 < len(s) && isDigit(s[i+2])) {
		return false
	}
	j, line := i-1, false
	for j >= 0 && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r' || s[j] == '\f' || s[j] == '\v') {
		line = line || s[j] == '\n'
		j--
	}
	if j < 0 {
		return true
	}
	// At the start of a line, the line before may end in a comment, whose last byte says
	// nothing: the sign is taken as an operator, as after a block comment (below).
	if c := s[j]; line || isWord(c) || c == ')' || c == ']' || c == '\'' || c == '"' || c == '.' {
		return false // after an operand (a name, a value, a number's trailing dot)
	}
	// After a block comment, the byte before the comment decides; rather than look past the
	// comment, the sign is taken as an operator (it stays, and the number after it is folded).
	return !(s[j] == '/' && j > 0 && s[j-1] == '*')
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isWord: a byte of a name, a number or a parameter ($1): a digit after it is part of it.
func isWord(c byte) bool {
	return c == '_' || c == '$' || isDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func skipLineComment(s string, i int) int {
	for i < len(s) && s[i] != '\n' {
		i++
	}
	return i
}

// skipBlockComment skips /* ... */, nested as PostgreSQL nests them; an unterminated one runs
// to the end.
func skipBlockComment(s string, i int) int {
	depth := 0
	for i+1 < len(s) {
		switch {
		case s[i] == '/' && s[i+1] == '*':
			depth++
			i += 2
		case s[i] == '*' && s[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(s)
}

// skipString skips '...' with ” inside; after an E prefix, a backslash escapes the next byte.
func skipString(s string, i int) int {
	escapes := i > 0 && (s[i-1] == 'E' || s[i-1] == 'e') && (i == 1 || !isWord(s[i-2]))
	i++
	for !escapes {
		k := strings.IndexByte(s[i:], '\'')
		if k < 0 {
			return len(s)
		}
		i += k
		if i+1 < len(s) && s[i+1] == '\'' {
			i += 2
			continue
		}
		return i + 1
	}
	for i < len(s) {
		switch {
		case escapes && s[i] == '\\':
			i += 2
			continue
		case s[i] == '\'':
			if i+1 < len(s) && s[i+1] == '\'' {
				i += 2
				continue
			}
			return i + 1
		}
		i++
	}
	return len(s)
}

func skipQuoted(s string, i int, q byte) int {
	i++
	for i < len(s) {
		if s[i] == q {
			if i+1 < len(s) && s[i+1] == q {
				i += 2
				continue
			}
			return i + 1
		}
		i++
	}
	return len(s)
}

// skipDollarString skips $tag$...$tag$ (tag empty or a name); ok is false if s[i:] does not
// start one.
func skipDollarString(s string, i int) (int, bool) {
	j := i + 1
	for j < len(s) && s[j] != '$' {
		c := s[j]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 || j > i+1 && isDigit(c)) {
			return 0, false
		}
		j++
	}
	if j >= len(s) {
		return 0, false
	}
	tag := s[i : j+1]
	for k := j + 1; k+len(tag) <= len(s); k++ {
		if s[k] == '$' && s[k:k+len(tag)] == tag {
			return k + len(tag), true
		}
	}
	return len(s), true
}

// skipParam skips $ and its digits.
func skipParam(s string, i int) int {
	i++
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}

// skipNumber skips a numeric literal: digits with _ separators, a fraction, an exponent, or a
// 0x/0o/0b prefix with its digits. Most numbers are digits alone: those are read here (one
// call, too big to inline), and the rest by skipNumberMore.
func skipNumber(s string, i int) int {
	e := i
	for e < len(s) && isDigit(s[e]) {
		e++
	}
	if e < len(s) && numMore[s[e]] {
		return skipNumberMore(s, i)
	}
	return e
}

// skipNumberMore is skipNumber for a number that is more than digits.
func skipNumberMore(s string, i int) int {
	if i+1 < len(s) && s[i] == '0' && (s[i+1]|0x20 == 'x' || s[i+1]|0x20 == 'o' || s[i+1]|0x20 == 'b') {
		i += 2
		for i < len(s) && (isDigit(s[i]) || s[i] == '_' || s[i]|0x20 >= 'a' && s[i]|0x20 <= 'f') {
			i++
		}
		return i
	}
	for i < len(s) && numByte[s[i]] {
		i++
	}
	if i < len(s) && s[i]|0x20 == 'e' {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			i = j
		}
	}
	return i
}

// numMore marks the bytes after a number's leading digits that make it more than digits: a
// separator, a fraction, an exponent or a base prefix (skipNumberMore reads it then).
var numMore = func() (t [256]bool) {
	for _, c := range []byte("_.eExXoObB") {
		t[c] = true
	}
	return t
}()

// numByte marks the bytes of a number's digits: digits, _ and the dot.
var numByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	t['_'], t['.'] = true, true
	return t
}()

// skipList reports whether s[i:] (at '(') is a list of one or more literals or parameters, each
// with an optional sign, separated by commas, with whitespace and comments between, and returns
// the index after its ')'.
func skipList(s string, i int) (int, bool) {
	i++
	for {
		i = skipListGap(s, i)
		if i >= len(s) {
			return 0, false
		}
		if s[i] == '+' || s[i] == '-' {
			i = skipListGap(s, i+1)
			if i >= len(s) {
				return 0, false
			}
		}
		c := s[i]
		switch {
		case isDigit(c):
			i = skipNumber(s, i)
		case c == '\'':
			i = skipString(s, i)
		case c == '$' && i+1 < len(s) && isDigit(s[i+1]):
			i = skipParam(s, i)
		case c == '$':
			e, ok := skipDollarString(s, i)
			if !ok {
				return 0, false
			}
			i = e
		case c == '.' && i+1 < len(s) && isDigit(s[i+1]):
			i = skipNumber(s, i)
		case (c == 'E' || c == 'e') && i+1 < len(s) && s[i+1] == '\'':
			i = skipString(s, i+1)
		default:
			return 0, false
		}
		i = skipListGap(s, i)
		if i >= len(s) {
			return 0, false
		}
		switch s[i] {
		case ',':
			i++
		case ')':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// skipListGap is skipGap for the gaps of a list, most often none.
func skipListGap(s string, i int) int {
	if i < len(s) && gapByte[s[i]] {
		return skipGap(s, i)
	}
	return i
}

// gapByte marks the bytes that may start whitespace or a comment.
var gapByte = func() (t [256]bool) {
	for _, c := range []byte(" \t\n\r\f\v-/") {
		t[c] = true
	}
	return t
}()

// skipGap skips whitespace and comments.
func skipGap(s string, i int) int {
	for i < len(s) {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v':
			i++
		case s[i] == '-' && i+1 < len(s) && s[i+1] == '-':
			i = skipLineComment(s, i)
		case s[i] == '/' && i+1 < len(s) && s[i+1] == '*':
			i = skipBlockComment(s, i)
		default:
			return i
		}
	}
	return i
}
