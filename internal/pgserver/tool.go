package pgserver

import (
	"errors"
	"fmt"
	"testing"
)

// toolDirs are searched after PATH: Debian installs some tools (pgbouncer) in /usr/sbin, which is
// not on the PATH of ordinary users.
var toolDirs = []string{"/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"}

// FindTool looks for the program name on PATH, then in /usr/sbin, /usr/local/sbin, /usr/bin and
// /usr/local/bin, and returns its path. If it is missing, the error says how to install it: the
// Debian package debianPackage and its apt-get line.
func FindTool(name, debianPackage string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("harness: FindTool: name is empty")
	case debianPackage == "":
		return "", fmt.Errorf("harness: FindTool: debianPackage is empty for %s", name)
	}
	path, err := findBinary(name, toolDirs...)
	if err != nil {
		return "", fmt.Errorf("harness: %w; install it (Debian/Ubuntu package %s): apt-get install -y %s",
			err, debianPackage, debianPackage)
	}
	return path, nil
}

// RequireTool returns the path of the program name, found as FindTool finds it, or fails tb at
// once with FindTool's instructions. It never skips: a test that needs a tool fails loudly where
// the tool is missing, so that a machine without it cannot pass the suite by skipping.
func RequireTool(tb testing.TB, name, debianPackage string) string {
	tb.Helper()
	path, err := FindTool(name, debianPackage)
	if err != nil {
		tb.Fatalf("%v (this test needs %s and does not skip without it)", err, name)
	}
	return path
}
