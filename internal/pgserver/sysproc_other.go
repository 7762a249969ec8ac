//go:build unix && !linux

package pgserver

import "syscall"

// sysProcAttr runs a child as cred. Other Unix systems (macOS, the BSDs) have no parent-death
// signal: a server outlives a test binary that is killed (a timeout, SIGKILL) and must be stopped
// by hand. removeStale keeps the directory of a PostgreSQL whose postmaster lives (postmaster.pid
// names it), not that of a PgBouncer, whose pid is then found only with ps. A test binary that
// ends normally stops its servers itself.
func sysProcAttr(cred *syscall.Credential, _ syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
