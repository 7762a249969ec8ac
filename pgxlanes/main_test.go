package pgxlanes

import (
	"testing"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// The package's own tests mostly need no server; those that look inside a lease against a real
// PostgreSQL (reuse_test.go) start the shared one lazily, and Main stops it.
func TestMain(m *testing.M) { pgserver.Main(m) }
