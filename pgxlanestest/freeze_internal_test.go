package pgxlanestest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// TestFreezeRefusesOtherSources checks that Freeze refuses, with what to do instead, a server
// from the environment or from Docker, and freezes nothing.
func TestFreezeRefusesOtherSources(t *testing.T) {
	pool := NewPool(t)
	pp, ok := lookup(pool)
	require.True(t, ok)
	for _, tc := range []struct {
		source string
		want   []string
	}{
		{pgserver.SourceEnv, []string{"the server comes from PGXLANES_TEST_DATABASE", "WithPrivateServer()", "unset PGXLANES_TEST_DATABASE"}},
		{pgserver.SourceDocker, []string{"the server runs in Docker", "WithPrivateServer()", "PGXLANES_TEST_DOCKER=0"}},
	} {
		t.Run(tc.source, func(t *testing.T) {
			// The shared server's DSN, as if it came from elsewhere.
			pools.Store(pool, &pooled{srv: pgserver.NewServer(pp.srv.DSN(), tc.source, nil), dsn: pp.dsn})
			defer pools.Store(pool, pp)
			_, err := freeze(pool, time.Minute)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.False(t, pp.srv.Frozen())
		})
	}
}
