//go:build !(aix || darwin || dragonfly || freebsd || linux || netbsd || openbsd || solaris)

package wire

import "syscall"

// pollWritable cannot tell on this platform: an interrupted write still under way after
// writeStall is taken as stalled.
func pollWritable(syscall.RawConn) bool { return false }
