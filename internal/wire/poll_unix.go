//go:build aix || darwin || dragonfly || freebsd || linux || netbsd || openbsd || solaris

package wire

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// pollWritable reports whether the send buffer of socket rc has room now (poll's POLLOUT, without
// waiting; on Linux, about a third of the buffer free), and false on any error or hang-up.
func pollWritable(rc syscall.RawConn) bool {
	ok := false
	err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		for {
			n, err := unix.Poll(fds, 0)
			if err == unix.EINTR {
				continue
			}
			ok = err == nil && n == 1 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) == 0 &&
				fds[0].Revents&unix.POLLOUT != 0
			return
		}
	})
	return err == nil && ok
}
