// Package integration tests pgxlanes against a real PostgreSQL started by internal/pgserver: from
// PGXLANES_TEST_DATABASE, a Docker engine (pgxlanestest/containers) or the local binaries.
package integration

import (
	"testing"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	_ "github.com/pgxlanes/pgxlanes/pgxlanestest/containers"
)

func TestMain(m *testing.M) { pgserver.Main(m) }
