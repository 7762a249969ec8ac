package pgxlanes

import "time"

// clockBase anchors monoNow.
var clockBase = time.Now()

// monoNow returns the time now from one read of the monotonic clock. time.Now also reads the wall
// clock, which on some VMs costs as much again (about 50 ns here, per acquire). Its wall reading
// is clockBase's plus the monotonic time since, so it drifts from the system's wall clock if that
// is stepped: the acquire uses it for durations and deadlines only (waits, hold times, the
// guard's ladder, Status's ages), all of which use the monotonic reading.
func monoNow() time.Time { return clockBase.Add(time.Since(clockBase)) }
