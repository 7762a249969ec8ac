package stmtstats

// The folder as it was before it was made faster (commit 3e2f98c), kept as the reference that
// FuzzFoldMatchesReference holds the folder to: same folded text, same hash, for every input.
// Test-only; every name is the original's with a ref prefix.

import (
	"encoding/binary"
	"hash/maphash"
	"unicode/utf8"
	"unsafe"
)

// What a byte may start, for the folder's loop.
const (
	refCPlain = iota // nothing: it stays as it is
	refCName         // a digit or $: part of a name after a name's byte, else a number or a parameter
	refCSpace        // whitespace
	refCOther        // may start a comment, a string, a number, a list or a quoted name: look closer
)

// refClassOf is the class of each byte, and a space is refCPlain: a text with no two spaces in a row
// (most texts) keeps its single spaces in the runs of the loop. refClassSpaced, for the other texts,
// stops at every space.
var refClassOf, refClassSpaced = func() (t, u [256]uint8) {
	for _, c := range []byte("\t\n\r\f\v") {
		t[c] = refCSpace
	}
	for _, c := range []byte("-/'(\"+") {
		t[c] = refCOther
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = refCName
	}
	t['$'] = refCName
	u = t
	u[' '] = refCSpace
	return t, u
}()

// refWordByte[c] is refIsWord(c), as a table for the loop.
var refWordByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = refIsWord(byte(c))
	}
	return t
}()

// refFoldSink takes the folded text in pieces. For a key it fills buf and hashes it at the end (a
// text whose fold is longer than buf is hashed as buf fills); for refFold it appends to out.
type refFoldSink struct {
	n       int
	display bool // append to out
	spilled bool // h has taken some of the text
	seed    maphash.Seed
	out     []byte
	h       maphash.Hash
	buf     [192]byte
}

func (o *refFoldSink) refWrite(t string) {
	if o.n+len(t) < len(o.buf) && !o.display {
		o.n += copy(o.buf[o.n:], t)
		return
	}
	o.refWriteSlow(t)
}

// refWriteSpace writes " ", as refWrite does.
func (o *refFoldSink) refWriteSpace() {
	if o.n+1 < len(o.buf) && !o.display {
		o.buf[o.n] = ' '
		o.n++
		return
	}
	o.refWriteSlow(" ")
}

func (o *refFoldSink) refWriteSlow(t string) {
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
				o.h.SetSeed(o.seed)
				o.spilled = true
			}
			o.h.Write(o.buf[:])
			o.n = 0
		}
	}
}

// refSum returns the hash of everything written (maphash's hash does not depend on how the bytes
// were split between writes).
func (o *refFoldSink) refSum() uint64 {
	if !o.spilled {
		return maphash.Bytes(o.seed, o.buf[:o.n])
	}
	o.h.Write(o.buf[:o.n])
	return o.h.Sum64()
}

// refFoldLoop writes the folded text of s to o in one pass. A run of bytes that stay as they are goes
// out in one piece, when something folded (or the end) comes after it. The loop stops only at
// bytes that may start something; a single space stays in the run, and is taken back out of it
// when it turns out to be part of a longer gap (a second space, a comment, the end).
func refFoldLoop(s string, o *refFoldSink) {
	var (
		run      int  // s[run:i] is pending, as it is
		space    bool // whitespace or a comment was folded since the last output: " " before the next
		emitted  bool // something went out: whitespace after it counts
		prevWord bool // s[i-1] is part of a name, a number or a parameter
		lastSp   = -1 // where the last space taken as it is was (not one inside a quoted name)
	)
	flush := func(i int) {
		if i > run {
			if space {
				o.refWriteSpace()
				space = false
			}
			o.refWrite(s[run:i])
			emitted = true
		}
	}
	// gap folds the whitespace and comments from i on, with a space that ends the run.
	gap := func(i int) int {
		if i > run && lastSp == i-1 {
			flush(i - 1)
		} else {
			flush(i)
		}
		i = refSkipGap(s, i)
		run, space = i, emitted
		return i
	}
	// fixed puts t in place of s[i:end].
	fixed := func(i, end int, t string) int {
		flush(i)
		if space {
			o.refWriteSpace()
			space = false
		}
		o.refWrite(t)
		emitted = true
		run = end
		return end
	}
	class := &refClassOf
	if refDoubleSpace(s) {
		class = &refClassSpaced
	}
	i := 0
	for i < len(s) {
		c := s[i]
		if c == ' ' {
			// A single space between two things that stay is its own fold: it stays in the run.
			if (i > run || emitted) && i+1 < len(s) && !refGapStarts(s, i+1) {
				lastSp = i
				i++
			} else {
				i = gap(i)
			}
			prevWord = false
			continue
		}
		switch class[c] {
		case refCPlain:
			// The common case, in one tight loop: bytes that start nothing, four at a time.
			i++
			for i+4 <= len(s) && class[s[i]]|class[s[i+1]]|class[s[i+2]]|class[s[i+3]] == refCPlain {
				i += 4
			}
			for i < len(s) && class[s[i]] == refCPlain {
				i++
			}
			if s[i-1] == ' ' {
				lastSp = i - 1
			}
			prevWord = refWordByte[s[i-1]]
			continue
		case refCName:
			switch {
			case prevWord: // a digit or $ of a name
				i++
				continue
			case c == '$':
				e, ok := refSkipDollarString(s, i)
				if !ok {
					i = refSkipParam(s, i) // $1 stays
					prevWord = true
					continue
				}
				i = fixed(i, e, "?")
			default:
				j := i
				if j > run && s[j-1] == '.' && (j-1 == run || !refWordByte[s[j-2]]) {
					j-- // .5: the dot is the number's
				}
				i = fixed(j, refSkipNumber(s, j), "?")
			}
		case refCSpace:
			i = gap(i)
		default: // refCOther
			switch {
			case refGapStarts(s, i): // a comment
				i = gap(i)
			case c == '\'':
				i = fixed(i, refSkipString(s, i), "?")
			case (c == '-' || c == '+') && refUnary(s, i):
				i = fixed(i, refSkipNumber(s, i+1), "?")
			case c == '(':
				if e, ok := refSkipList(s, i); ok {
					i = fixed(i, e, "(?)")
				} else {
					i++
				}
			case c == '"':
				i = refSkipQuoted(s, i, '"')
			default:
				i++
			}
		}
		prevWord = false
	}
	gap(len(s))
}

// refDoubleSpace reports whether s has two spaces in a row, eight bytes at a time.
func refDoubleSpace(s string) bool {
	const ones, spaces = 0x7f7f7f7f7f7f7f7f, 0x2020202020202020
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	var carry uint64 // 0x80 if the byte before this word was a space
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:]) ^ spaces
		z := ^((v&ones + ones) | v | ones) // 0x80 in each byte that was a space
		if z&(z<<8|carry) != 0 {
			return true
		}
		carry = z >> 56
	}
	for ; i < len(b); i++ {
		if b[i] == ' ' && i > 0 && b[i-1] == ' ' {
			return true
		}
	}
	return false
}

// refGapStarts reports whether whitespace or a comment starts at s[i].
func refGapStarts(s string, i int) bool {
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

// refFoldHash hashes the folded text without building it, and without allocating.
func refFoldHash(seed maphash.Seed, sql string) uint64 {
	o := refFoldSink{seed: seed}
	refFoldLoop(sql, &o)
	return o.refSum()
}

// refFold returns the text as the Table keys it: literals, lists of literals, comments and
// whitespace folded, cut to at most n bytes (with "…" when cut). Use it to show a statement
// without the values it carried.
func refFold(sql string, n int) string {
	o := refFoldSink{display: true, out: make([]byte, 0, len(sql))}
	refFoldLoop(sql, &o)
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

// refUnary reports whether the sign at s[i] starts a signed number: a digit follows, and what comes
// before it (whitespace aside) is not an operand (a name, a number, a parameter, a string, a
// quoted name, ')' or ']') nor the end of a block comment: an operator, a comma, '(', or nothing.
// Taking a sign for an operator is always safe (at worst two texts that could share a key do
// not); taking an operator for a sign would give a[1]-1 and a[1]+1 one key.
func refUnary(s string, i int) bool {
	if i+1 >= len(s) || !refIsDigit(s[i+1]) && !(s[i+1] == '.' && i+2 < len(s) && refIsDigit(s[i+2])) {
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
	if c := s[j]; line || refIsWord(c) || c == ')' || c == ']' || c == '\'' || c == '"' || c == '.' {
		return false // after an operand (a name, a value, a number's trailing dot)
	}
	// After a block comment, the byte before the comment decides; rather than look past the
	// comment, the sign is taken as an operator (it stays, and the number after it is folded).
	return !(s[j] == '/' && j > 0 && s[j-1] == '*')
}

func refIsDigit(c byte) bool { return c >= '0' && c <= '9' }

// refIsWord: a byte of a name, a number or a parameter ($1): a digit after it is part of it.
func refIsWord(c byte) bool {
	return c == '_' || c == '$' || refIsDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func refSkipLineComment(s string, i int) int {
	for i < len(s) && s[i] != '\n' {
		i++
	}
	return i
}

// refSkipBlockComment skips /* ... */, nested as PostgreSQL nests them; an unterminated one runs
// to the end.
func refSkipBlockComment(s string, i int) int {
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

// refSkipString skips '...' with ” inside; after an E prefix, a backslash escapes the next byte.
func refSkipString(s string, i int) int {
	escapes := i > 0 && (s[i-1] == 'E' || s[i-1] == 'e') && (i == 1 || !refIsWord(s[i-2]))
	i++
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

func refSkipQuoted(s string, i int, q byte) int {
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

// refSkipDollarString skips $tag$...$tag$ (tag empty or a name); ok is false if s[i:] does not
// start one.
func refSkipDollarString(s string, i int) (int, bool) {
	j := i + 1
	for j < len(s) && s[j] != '$' {
		c := s[j]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 || j > i+1 && refIsDigit(c)) {
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

// refSkipParam skips $ and its digits.
func refSkipParam(s string, i int) int {
	i++
	for i < len(s) && refIsDigit(s[i]) {
		i++
	}
	return i
}

// refSkipNumber skips a numeric literal: digits with _ separators, a fraction, an exponent, or a
// 0x/0o/0b prefix with its digits.
func refSkipNumber(s string, i int) int {
	if i+1 < len(s) && s[i] == '0' && (s[i+1]|0x20 == 'x' || s[i+1]|0x20 == 'o' || s[i+1]|0x20 == 'b') {
		i += 2
		for i < len(s) && (refIsDigit(s[i]) || s[i] == '_' || s[i]|0x20 >= 'a' && s[i]|0x20 <= 'f') {
			i++
		}
		return i
	}
	for i < len(s) && refNumByte[s[i]] {
		i++
	}
	if i < len(s) && s[i]|0x20 == 'e' {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && refIsDigit(s[j]) {
			for j < len(s) && refIsDigit(s[j]) {
				j++
			}
			i = j
		}
	}
	return i
}

// refNumByte marks the bytes of a number's digits: digits, _ and the dot.
var refNumByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	t['_'], t['.'] = true, true
	return t
}()

// refSkipList reports whether s[i:] (at '(') is a list of one or more literals or parameters, each
// with an optional sign, separated by commas, with whitespace and comments between, and returns
// the index after its ')'.
func refSkipList(s string, i int) (int, bool) {
	i++
	items := 0
	for {
		i = refSkipListGap(s, i)
		if i >= len(s) {
			return 0, false
		}
		if s[i] == '+' || s[i] == '-' {
			i = refSkipListGap(s, i+1)
			if i >= len(s) {
				return 0, false
			}
		}
		c := s[i]
		switch {
		case c == '\'':
			i = refSkipString(s, i)
		case c == '$' && i+1 < len(s) && refIsDigit(s[i+1]):
			i = refSkipParam(s, i)
		case c == '$':
			e, ok := refSkipDollarString(s, i)
			if !ok {
				return 0, false
			}
			i = e
		case refIsDigit(c) || c == '.' && i+1 < len(s) && refIsDigit(s[i+1]):
			i = refSkipNumber(s, i)
		case (c == 'E' || c == 'e') && i+1 < len(s) && s[i+1] == '\'':
			i = refSkipString(s, i+1)
		default:
			return 0, false
		}
		items++
		i = refSkipListGap(s, i)
		if i >= len(s) {
			return 0, false
		}
		switch s[i] {
		case ',':
			i++
		case ')':
			return i + 1, items > 0
		default:
			return 0, false
		}
	}
}

// refSkipListGap is refSkipGap for the gaps of a list, most often a single space or none.
func refSkipListGap(s string, i int) int {
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i < len(s) && refGapStarts(s, i) {
		return refSkipGap(s, i)
	}
	return i
}

// refSkipGap skips whitespace and comments.
func refSkipGap(s string, i int) int {
	for i < len(s) {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v':
			i++
		case s[i] == '-' && i+1 < len(s) && s[i+1] == '-':
			i = refSkipLineComment(s, i)
		case s[i] == '/' && i+1 < len(s) && s[i+1] == '*':
			i = refSkipBlockComment(s, i)
		default:
			return i
		}
	}
	return i
}
