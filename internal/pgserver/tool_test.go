package pgserver_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// recordTB records what RequireTool does to its test instead of doing it. Methods it does not
// override panic (the embedded TB is nil), so an unexpected call shows.
type recordTB struct {
	testing.TB
	fatal   string
	skipped bool
}

func (r *recordTB) Helper()                   {}
func (r *recordTB) Fatal(args ...any)         { r.fatal = fmt.Sprint(args...) }
func (r *recordTB) Fatalf(f string, a ...any) { r.fatal = fmt.Sprintf(f, a...) }
func (r *recordTB) FailNow()                  { r.fatal = "FailNow" }
func (r *recordTB) Skip(...any)               { r.skipped = true }
func (r *recordTB) Skipf(string, ...any)      { r.skipped = true }
func (r *recordTB) SkipNow()                  { r.skipped = true }

func TestRequireToolFound(t *testing.T) {
	path := pgserver.RequireTool(t, "sh", "dash")
	assert.NotEmpty(t, path)
	// pgbouncer is in /usr/sbin on Debian, off the PATH of ordinary users.
	t.Setenv("PATH", t.TempDir())
	path, err := pgserver.FindTool("pgbouncer", "pgbouncer")
	require.NoError(t, err, "pgbouncer is installed on this machine")
	assert.NotEmpty(t, path)
}

func TestRequireToolMissingFailsLoudly(t *testing.T) {
	r := &recordTB{}
	path := pgserver.RequireTool(r, "no-such-tool-pgxlanes", "no-such-package")
	assert.Empty(t, path)
	assert.False(t, r.skipped, "RequireTool skipped")
	for _, want := range []string{
		"harness: ", "no-such-tool-pgxlanes not found", "Debian/Ubuntu package no-such-package",
		"apt-get install -y no-such-package", "does not skip",
	} {
		assert.Contains(t, r.fatal, want)
	}

	_, err := pgserver.FindTool("", "x")
	assert.ErrorContains(t, err, "name is empty")
	_, err = pgserver.FindTool("sh", "")
	assert.ErrorContains(t, err, "debianPackage is empty")
}
