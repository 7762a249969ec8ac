package pgxlanes

import (
	"runtime"
	"strconv"
	"strings"
)

// callSite is a captured stack, formatted only when needed.
type callSite struct {
	pcs []uintptr
}

// captureCallSite records the stack of the acquire. It allocates: it runs only with
// Config.CaptureCallSites, as HikariCP's leak detection does.
func captureCallSite() callSite {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(2, pcs)
	return callSite{pcs: pcs[:n]}
}

// String returns the first frame outside pgxlanes, pgx and the runtime as "file.go:123 pkg.Func",
// or "" if nothing was captured.
func (c callSite) String() string {
	if len(c.pcs) == 0 {
		return ""
	}
	frames := runtime.CallersFrames(c.pcs)
	var first string
	for {
		f, more := frames.Next()
		s := shortFile(f.File) + ":" + strconv.Itoa(f.Line) + " " + f.Function
		if first == "" {
			first = s
		}
		if !internalFrame(f.Function) {
			return s
		}
		if !more {
			return first
		}
	}
}

func internalFrame(fn string) bool {
	for _, p := range []string{"github.com/pgxlanes/pgxlanes/pgxlanes.", "github.com/pgxlanes/pgxlanes/stdlib.",
		"github.com/jackc/pgx/", "database/sql.", "runtime."} {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}

func shortFile(path string) string {
	if i := strings.LastIndex(path, "/"); i >= 0 {
		if j := strings.LastIndex(path[:i], "/"); j >= 0 {
			return path[j+1:]
		}
	}
	return path
}
