package wire

import (
	"bytes"
	"encoding/binary"
)

// The PostgreSQL protocol (version 3) frames every message after startup as one type byte and a
// big-endian int32 length that counts itself and the body but not the type byte.
const headerLen = 5

// Message types this package looks at. Frontend and backend types share letters ('S' is Sync
// from the client and ParameterStatus from the server), so each is named for its direction.
const (
	feQuery     = 'Q'
	feSync      = 'S'
	feFuncCall  = 'F'
	feParse     = 'P'
	feBind      = 'B'
	feDescribe  = 'D'
	feExecute   = 'E'
	feClose     = 'C'
	feFlush     = 'H'
	feTerminate = 'X'
	feCopyData  = 'd'
	feCopyDone  = 'c'
	feCopyFail  = 'f'

	beReady        = 'Z'
	beComplete     = 'C'
	beError        = 'E'
	beNotice       = 'N'
	beNotification = 'A'
	beParamStatus  = 'S'
	beCopyIn       = 'G'
	beDataRow      = 'D'
	beParseDone    = '1' // ParseComplete
)

// header returns the type and total size (type byte included) of the message at the start of b,
// and false if b holds fewer than headerLen bytes.
func header(b []byte) (typ byte, size int, ok bool) {
	if len(b) < headerLen {
		return 0, 0, false
	}
	return b[0], 1 + int(binary.BigEndian.Uint32(b[1:headerLen])), true
}

// appendQuery appends a simple-protocol Query message for sql.
func appendQuery(b []byte, sql string) []byte {
	b = append(b, feQuery)
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(sql)+1))
	b = append(b, sql...)
	return append(b, 0)
}

// appendReady appends a ReadyForQuery message with transaction status tx.
func appendReady(b []byte, tx byte) []byte {
	return append(b, beReady, 0, 0, 0, 5, tx)
}

// appendError appends an ErrorResponse with the given SQLSTATE code and message, severity ERROR.
func appendError(b []byte, code, msg string) []byte {
	start := len(b)
	b = append(b, beError, 0, 0, 0, 0)
	for _, f := range [...]struct {
		k byte
		v string
	}{{'S', "ERROR"}, {'V', "ERROR"}, {'C', code}, {'M', msg}} {
		b = append(b, f.k)
		b = append(b, f.v...)
		b = append(b, 0)
	}
	b = append(b, 0)
	binary.BigEndian.PutUint32(b[start+1:], uint32(len(b)-start-1))
	return b
}

// errorField returns field k ('S' severity, 'C' code, 'M' message) of an ErrorResponse or
// NoticeResponse body, or "".
func errorField(body []byte, k byte) string {
	for len(body) > 0 && body[0] != 0 {
		key := body[0]
		end := bytes.IndexByte(body[1:], 0)
		if end < 0 {
			return ""
		}
		if key == k {
			return string(body[1 : 1+end])
		}
		body = body[2+end:]
	}
	return ""
}

// fatal reports whether an ErrorResponse body has severity FATAL or PANIC: the server is ending
// the session, so pgconn must see it whatever this package was doing with the response.
func fatal(body []byte) bool {
	s := errorField(body, 'V')
	if s == "" {
		s = errorField(body, 'S')
	}
	return s == "FATAL" || s == "PANIC"
}

// changesSettings reports whether a CommandComplete body is the tag of a statement that may have
// changed the session's settings: SET, RESET or DISCARD (the user's own, on a lease).
func changesSettings(body []byte) bool {
	return bytes.HasPrefix(body, []byte("SET\x00")) || bytes.HasPrefix(body, []byte("RESET\x00")) ||
		bytes.HasPrefix(body, []byte("DISCARD"))
}

// namedParse reports whether a Parse message body creates a named prepared statement.
func namedParse(body []byte) bool { return len(body) > 0 && body[0] != 0 }

// parseName returns the statement name at the start of a Parse message's body, if the body
// holds all of it.
func parseName(body []byte) (string, bool) {
	i := bytes.IndexByte(body, 0)
	if i < 0 {
		return "", false
	}
	return string(body[:i]), true
}

// appendCloseStatements appends a Close of each named statement and a Sync.
func appendCloseStatements(b []byte, names []string) []byte {
	for _, n := range names {
		b = append(b, feClose)
		b = binary.BigEndian.AppendUint32(b, uint32(4+1+len(n)+1))
		b = append(b, 'S')
		b = append(b, n...)
		b = append(b, 0)
	}
	return append(b, feSync, 0, 0, 0, 4)
}

// appendCopyFail appends a CopyFail message with the given reason.
func appendCopyFail(b []byte, reason string) []byte {
	b = append(b, feCopyFail)
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(reason)+1))
	b = append(b, reason...)
	return append(b, 0)
}
