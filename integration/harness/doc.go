// Package harness gives tests, benchmarks and demos a throwaway PostgreSQL server.
//
// Start looks for a server in this order and logs to stderr which one it used:
//
//  1. The DSN in the environment variable PGXLANES_TEST_DATABASE, used as is. Close does nothing.
//  2. A Docker engine through testcontainers-go, when one answers a ping within two seconds.
//     Set PGXLANES_TEST_DOCKER=0 to skip this step, and PGXLANES_TEST_IMAGE to choose the image
//     (default postgres:17-alpine).
//  3. The local PostgreSQL binaries: initdb and postgres found on PATH or under
//     /usr/lib/postgresql/*/bin (highest version first). The harness runs initdb in a temporary
//     directory of its own and starts postgres on a free 127.0.0.1 port. As root, both run as the
//     user postgres, because they refuse to run as root.
//
// If none of these works, Start fails with an error that says what to install. It never skips
// silently.
//
// Every server the harness starts itself has a superuser postgres with a random password, so DSN
// carries a real password. Settings are tuned for tests, not for durability: fsync=off,
// synchronous_commit=off, full_page_writes=off, max_connections=300, shared_buffers=128MB.
//
// Test packages use Main in TestMain and DSN or NewDatabase in their tests:
//
//	func TestMain(m *testing.M) { harness.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		dsn := harness.NewDatabase(t) // a fresh database, dropped when the test ends
//		...
//	}
//
// StartPgBouncer runs the pgbouncer binary in front of a server, for tests of pool modes.
package harness
