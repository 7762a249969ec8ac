package stmtstats

import (
	"hash/maphash"
	"unicode/utf8"
)

// Folding: texts that differ only in literals share a key. A scanner walks the text once and
// yields it as segments: runs of the text as it is, and, in place of what it folds, a fixed
// segment:
//
//   - a number (42, 3.14, 1e6, 0x1F, 1_000) that is not part of a name: "?"
//   - a string ('it''s', E'\n', $$body$$, $tag$body$tag$): "?"
//   - a parenthesised list of only literals and parameters ((1, 2, 3), ('a','b'), ($1,$2)),
//     whatever its length: "(?)"
//   - a comment (-- to the end of the line, /* nested */) and a run of whitespace: one space,
//     none at the start or the end
//
// Names, quoted names ("t1"), parameters outside a list ($1) and everything else stay as they
// are. The key hashes the segments, the folded text is their concatenation (Fold).

// segment kinds
const (
	segText  = iota // s[from:to] as it is
	segValue        // "?"
	segList         // "(?)"
	segSpace        // " "
)

var segFixed = [...]string{segValue: "?", segList: "(?)", segSpace: " "}

type scanner struct {
	s        string
	i        int
	pendSp   bool // whitespace seen since the last segment: emit " " before the next one
	emitted  bool // a segment was emitted: whitespace before the next one counts
	text0    int  // start of the pending verbatim run
	prevWord bool // the byte before i is part of a name or number
}

// next returns the next segment: its kind and, for segText, the text. ok is false at the end.
func (sc *scanner) next() (kind int, text string, ok bool) {
	s := sc.s
	for sc.i < len(s) {
		c := s[sc.i]
		start := sc.i
		var end, k int
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			end, k = skipSpace(s, sc.i), segSpace
		case c == '-' && sc.i+1 < len(s) && s[sc.i+1] == '-':
			end, k = skipLineComment(s, sc.i), segSpace
		case c == '/' && sc.i+1 < len(s) && s[sc.i+1] == '*':
			end, k = skipBlockComment(s, sc.i), segSpace
		case c == '\'':
			end, k = skipString(s, sc.i), segValue
		case c == '$' && !sc.prevWord:
			if e, ok := skipDollarString(s, sc.i); ok {
				end, k = e, segValue
			} else {
				end, k = skipParam(s, sc.i), segText
			}
		case isDigit(c) && !sc.prevWord, c == '.' && !sc.prevWord && sc.i+1 < len(s) && isDigit(s[sc.i+1]):
			end, k = skipNumber(s, sc.i), segValue
		case (c == '-' || c == '+') && unary(s, sc.i):
			end, k = skipNumber(s, sc.i+1), segValue
		case c == '(':
			if e, ok := skipList(s, sc.i); ok {
				end, k = e, segList
			} else {
				end, k = sc.i+1, segText
			}
		case c == '"':
			end, k = skipQuoted(s, sc.i, '"'), segText
		default:
			// A run of bytes that start nothing: the common case, in one tight loop.
			end, k = sc.i+1, segText
			// A single space between two such bytes is its own fold, and a dot before one starts no
			// number: they stay in the run.
			for end < len(s) && (special[s[end]] == 0 || special[s[end]] == 2 && isWord(s[end-1]) ||
				(s[end] == ' ' || s[end] == '.') && end+1 < len(s) && special[s[end+1]] == 0) {
				end++
			}
		}
		if k == segText {
			if sc.pendSp {
				// The whitespace before this text: flush it first.
				sc.pendSp = false
				sc.text0 = start
				return segSpace, "", true
			}
			sc.i = end
			sc.prevWord = isWord(s[end-1])
			continue // extend the verbatim run
		}
		// A folded segment: first the verbatim run before it, then the segment.
		if sc.text0 < start {
			sc.emitted = true
			t := s[sc.text0:start]
			sc.text0 = start
			return segText, t, true
		}
		if k == segSpace {
			sc.i, sc.text0 = end, end
			sc.pendSp = sc.emitted
			sc.prevWord = false
			continue
		}
		if sc.pendSp {
			sc.pendSp = false
			return segSpace, "", true
		}
		sc.i, sc.text0 = end, end
		sc.prevWord = false
		sc.emitted = true
		return k, "", true
	}
	if sc.text0 < len(s) {
		t := s[sc.text0:]
		sc.text0 = len(s)
		return segText, t, true
	}
	return 0, "", false
}

// foldHash hashes the folded text without building it.
func foldHash(seed maphash.Seed, sql string) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	sc := scanner{s: sql}
	for {
		k, t, ok := sc.next()
		if !ok {
			return h.Sum64()
		}
		if k == segText {
			h.WriteString(t)
		} else {
			h.WriteString(segFixed[k])
		}
	}
}

// Fold returns the text as the Table keys it: literals, lists of literals, comments and
// whitespace folded, cut to at most n bytes (with "…" when cut). Use it to show a statement
// without the values it carried.
func Fold(sql string, n int) string {
	b := make([]byte, 0, min(len(sql), n)+3)
	sc := scanner{s: sql}
	for {
		k, t, ok := sc.next()
		if !ok {
			return string(b)
		}
		if k != segText {
			t = segFixed[k]
		}
		if len(b)+len(t) > n {
			b = append(b, t[:n-len(b)]...)
			for len(b) > 0 && !utf8.Valid(b[max(len(b)-utf8.UTFMax, 0):]) { // do not cut a rune
				b = b[:len(b)-1]
			}
			return string(append(b, "…"...))
		}
		b = append(b, t...)
	}
}

// unary reports whether the sign at s[i] starts a signed number: a digit follows, and what comes
// before it (whitespace aside) is not an operand: an operator, a comma, a parenthesis, or nothing.
func unary(s string, i int) bool {
	if i+1 >= len(s) || !isDigit(s[i+1]) && !(s[i+1] == '.' && i+2 < len(s) && isDigit(s[i+2])) {
		return false
	}
	j := i - 1
	for j >= 0 && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r') {
		j--
	}
	return j < 0 || !isWord(s[j]) && s[j] != ')' && s[j] != '\'' && s[j] != '"'
}

// special marks the bytes that may start something the scanner folds or skips: 1 always, 2 only
// when not inside a name (digits, $).
var special = func() (t [256]uint8) {
	for _, c := range []byte(" \t\n\r\f\v-/'(\".+") {
		t[c] = 1
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = 2
	}
	t['$'] = 2
	return t
}()

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isWord: a byte of a name, a number or a parameter ($1): a digit after it is part of it.
func isWord(c byte) bool {
	return c == '_' || c == '$' || isDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func skipSpace(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			i++
		default:
			return i
		}
	}
	return i
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
// 0x/0o/0b prefix with its digits.
func skipNumber(s string, i int) int {
	if i+1 < len(s) && s[i] == '0' && (s[i+1]|0x20 == 'x' || s[i+1]|0x20 == 'o' || s[i+1]|0x20 == 'b') {
		i += 2
		for i < len(s) && (isDigit(s[i]) || s[i] == '_' || s[i]|0x20 >= 'a' && s[i]|0x20 <= 'f') {
			i++
		}
		return i
	}
	for i < len(s) && (isDigit(s[i]) || s[i] == '_' || s[i] == '.') {
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

// skipList reports whether s[i:] (at '(') is a list of one or more literals or parameters, each
// with an optional sign, separated by commas, with whitespace and comments between, and returns
// the index after its ')'.
func skipList(s string, i int) (int, bool) {
	i++
	items := 0
	for {
		i = skipGap(s, i)
		if i >= len(s) {
			return 0, false
		}
		if s[i] == '+' || s[i] == '-' {
			i = skipGap(s, i+1)
			if i >= len(s) {
				return 0, false
			}
		}
		c := s[i]
		switch {
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
		case isDigit(c) || c == '.' && i+1 < len(s) && isDigit(s[i+1]):
			i = skipNumber(s, i)
		case (c == 'E' || c == 'e') && i+1 < len(s) && s[i+1] == '\'':
			i = skipString(s, i+1)
		default:
			return 0, false
		}
		items++
		i = skipGap(s, i)
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
