package pgserver

import "syscall"

// sysProcAttr runs a child as cred, signalled with deathSig when this process dies. Pdeathsig
// fires when the thread that started the child exits. Go threads live as long as the process
// unless a goroutine exits while locked to its thread, which the harness never does.
func sysProcAttr(cred *syscall.Credential, deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: deathSig}
}
