// Package integration tests pgxlanes against a real PostgreSQL started by the harness.
package integration

import (
	"testing"

	"github.com/pgxlanes/pgxlanes/integration/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
