package txguard

import (
	"runtime"
	"strconv"
	"strings"
)

// CallSite is a captured stack, formatted only when needed.
type CallSite struct {
	pcs []uintptr
}

// Capture records the caller's stack, skipping skip frames above Capture. It allocates: callers
// turn it on explicitly, as HikariCP's leak detection is.
func Capture(skip int) CallSite {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(skip+2, pcs)
	return CallSite{pcs: pcs[:n]}
}

// Empty reports whether no stack was captured.
func (c CallSite) Empty() bool { return len(c.pcs) == 0 }

// String returns the first frame outside pgxlanes, pgx and the standard library as
// "file.go:123 pkg.Func", or "" if nothing was captured.
func (c CallSite) String() string {
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
		if !internal(f.Function) {
			return s
		}
		if !more {
			return first
		}
	}
}

func internal(fn string) bool {
	for _, p := range []string{"github.com/pgxlanes/pgxlanes/pgxlanes.", "github.com/pgxlanes/pgxlanes/txguard.", "github.com/jackc/pgx/", "runtime."} {
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
