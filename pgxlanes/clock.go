package pgxlanes

import "time"

// clockBase anchors mono.
var clockBase = time.Now()

// mono is a reading of the monotonic clock: nanoseconds since clockBase. The acquire and the
// lease keep their times as mono: one read of the monotonic clock (time.Since) and integer
// arithmetic, where a time.Time from time.Now also reads the wall clock and each Add, Sub and
// Since handles both readings (about 10 ns an acquire here, besides the reads). They are used for
// durations and deadlines only (waits, hold times, the guard's ladder, Status's ages), as the
// monotonic reading of a time.Time would be.
type mono int64

// monoNow reads the monotonic clock once.
func monoNow() mono { return mono(time.Since(clockBase)) }

// since returns the time elapsed since m.
func (m mono) since() time.Duration { return time.Duration(monoNow() - m) }

// time returns m as a time.Time with a monotonic reading (clockBase's wall clock plus the
// monotonic time since: it drifts from the system's wall clock if that is stepped).
func (m mono) time() time.Time { return clockBase.Add(time.Duration(m)) }
