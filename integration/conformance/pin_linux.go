//go:build linux

package conformance

import (
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"
)

// canPin says whether startPinned narrows the CPUs of the process it starts.
const canPin = true

// cpuSet is a cpu_set_t of 1024 CPUs.
type cpuSet [16]uint64

// startPinned starts cmd with at most n CPUs in its affinity mask. pgxpool's default MaxConns is
// the greater of 4 and runtime.NumCPU(), which counts the CPUs of that mask: pinning gives the
// tests the same default pool on every machine, and the allowlist the same failures.
//
// A child inherits the affinity of the thread that forks it, so the mask of the calling thread
// is narrowed, locked to this goroutine, for the fork, and restored before the thread is
// unlocked. The thread must not exit instead: internal/pgserver starts its server with
// Pdeathsig, which fires when the starting thread exits, and this may be that thread.
func startPinned(cmd *exec.Cmd, n int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old cpuSet
	if err := schedAffinity(syscall.SYS_SCHED_GETAFFINITY, &old); err != nil {
		return err
	}
	narrow := old
	kept := 0
	for i := range narrow {
		for b := range 64 {
			if narrow[i]&(1<<b) == 0 {
				continue
			}
			if kept < n {
				kept++
			} else {
				narrow[i] &^= 1 << b
			}
		}
	}
	if err := schedAffinity(syscall.SYS_SCHED_SETAFFINITY, &narrow); err != nil {
		return err
	}
	err := cmd.Start()
	// Should the restore fail, the thread keeps the narrow mask: goroutines scheduled on it later
	// get fewer CPUs, nothing worse.
	_ = schedAffinity(syscall.SYS_SCHED_SETAFFINITY, &old)
	return err
}

// schedAffinity gets or sets the calling thread's affinity mask.
func schedAffinity(trap uintptr, s *cpuSet) error {
	if _, _, e := syscall.RawSyscall(trap, 0, unsafe.Sizeof(*s), uintptr(unsafe.Pointer(s))); e != 0 {
		return e
	}
	return nil
}
