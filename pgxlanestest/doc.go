// Package pgxlanestest gives the tests of a service built on pgxlanes a real, throwaway
// PostgreSQL and the means to starve it.
//
// NewPool returns a pool on a fresh database of its own, dropped with the pool when the test ends:
//
//	func TestBalance(t *testing.T) {
//		pool := pgxlanestest.NewPool(t, pgxlanestest.WithSchema(`create table accounts (id int primary key, balance bigint)`))
//		svc := NewService(pool)
//		...
//	}
//
// # Where the server comes from
//
// All the pools of a test binary share one server, found once, at the first NewPool, in this
// order:
//
//  1. The DSN in PGXLANES_TEST_DATABASE (a URL or keyword/value string), used as is. Its user must
//     be allowed to create databases, and the server must be PostgreSQL 13 or later (the
//     databases are dropped WITH (FORCE)). Nothing is started or stopped.
//
//  2. A Docker engine, through testcontainers-go's Postgres module, if the test binary imports
//     the Docker step for its side effect:
//
//     import _ "github.com/pgxlanes/pgxlanes/pgxlanestest/containers"
//
//     That package is a module of its own, so that a project that does not import it does not
//     pull testcontainers and moby into its test build. The engine must answer a ping within two
//     seconds. PGXLANES_TEST_IMAGE chooses the image (default: the package's DefaultImage, an
//     official postgres image); PGXLANES_TEST_DOCKER=0 skips the step.
//
//  3. The local PostgreSQL server binaries (initdb and postgres on PATH, or under
//     /usr/lib/postgresql/*/bin): the server runs as a child of the test process on a free
//     127.0.0.1 port, from a data directory in a temporary directory, tuned for tests
//     (fsync=off). As root it runs as the user postgres.
//
//  4. Otherwise NewPool fails the test with what to install (apt-get install -y postgresql, or a
//     Docker engine and the import above, or PGXLANES_TEST_DATABASE). It never skips.
//
// Each NewPool creates a database on that server (CREATE DATABASE takes a few milliseconds) and
// drops it, closing its sessions, when the test's cleanups run. WithPrivateServer gives a pool a
// server of its own instead, for tests that hurt the server.
//
// # The server's life
//
// The shared server starts at the first NewPool and stops at the end of the test binary. Call
// Main from TestMain to stop it cleanly:
//
//	func TestMain(m *testing.M) { pgxlanestest.Main(m) }
//
// Without Main, NewPool works the same, and the server dies with the test process: a local
// postmaster gets SIGQUIT from the kernel when its parent exits, a container is removed by
// testcontainers' reaper. What stays behind is the local server's temporary directory
// ($TMPDIR/pgxlanes-harness-<pid>-local-*, 20 to 60 MB of data files), until the next test binary
// that starts a server removes the directories of processes that no longer exist. A server from
// PGXLANES_TEST_DATABASE is never touched; a test binary killed before its cleanups run leaves
// its databases (pgxlanes_<pid>_*) there.
//
// # Starving a service
//
// HoldLocks, SaturateLane and Freeze put a service under the conditions pgxlanes is for, each
// for a bounded time, undone by Stop (or Thaw) and by the test's cleanup:
//
//   - HoldLocks holds n transactions on row locks, as a storm of long transactions does;
//   - SaturateLane holds every connection a lane can reach;
//   - Freeze stops the server's processes with SIGSTOP, so that it hangs instead of failing.
package pgxlanestest
