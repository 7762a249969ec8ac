// Package pgserver gives tests, benchmarks and demos a throwaway PostgreSQL server.
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
//	func TestMain(m *testing.M) { pgserver.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		dsn := pgserver.NewDatabase(t) // a fresh database, dropped when the test ends
//		...
//	}
//
// StartPgBouncer runs the pgbouncer binary in front of a server, for tests of pool modes.
//
// # Servers of a test's own
//
// StartLocal (or NewLocal, which closes the server in a cleanup) always starts a new server from
// the local binaries, whatever PGXLANES_TEST_DATABASE and Docker offer, so that a test can have
// several (a primary and a stand-in replica) and hurt them without touching the shared one:
//
//	s := pgserver.NewLocal(t, pgserver.Options{
//		MaxConnections: 8, // below the pool's size
//		Settings:       map[string]string{"deadlock_timeout": "50ms"}, // extra -c settings
//	})
//
// Options.MaxConnections sets max_connections (default 300); the harness's user postgres is a
// superuser and gets all of them, then "sorry, too many clients already" (SQLSTATE 53300).
// Options.Settings override the harness's settings, except those that place the server (port,
// listen_addresses, socket directory, data directory).
//
// # Faults of the server
//
// These work on servers the harness started from local binaries (StartLocal, NewLocal, and
// Start's local step); on others they return an error wrapping ErrNotLocal. Hurt only servers of
// the test's own: other tests share the server of DSN, Shared and NewDatabase.
//
//   - Restart(ctx, StopFast or StopImmediate) stops the postmaster with SIGINT (pg_ctl -m fast:
//     sessions terminated with 57P01, transactions rolled back) or SIGQUIT (-m immediate: a
//     crash; recovery at the next start empties unlogged tables), starts it again on the same
//     port and data directory, and returns RestartStats: old and new PID, time to stop, time
//     down until a connection succeeded. A restart costs about 0.1 s.
//   - StopPostmaster(mode) and StartPostmaster(ctx) do the two halves, for tests that need the
//     server down for a while (connections are refused meanwhile).
//   - Freeze stops the postmaster and all its children (backends, checkpointer, ...) with
//     SIGSTOP: connections hang instead of failing. Thaw resumes them and is safe to call twice.
//     Close, Restart and StopPostmaster thaw first, Main closes every local server a test left
//     open, and a guard process thaws the server if the test process dies without cleaning up
//     (a -timeout panic, SIGKILL), so that no stopped postmaster outlives a test run.
//   - PID (the postmaster's, 0 while stopped), Port and DataDir are the facts tests check.
//
// # Faults of the network
//
// NewProxy(t, dsn) (or StartProxy) puts a TCP proxy on 127.0.0.1 in front of the server of dsn
// and returns it with DSN, the same server through the proxy. At run time, per direction
// (faultproxy.Upstream, Downstream, Both) where it matters:
//
//	p.SetLatency(faultproxy.Both, time.Millisecond) // 1 ms each way: +2 ms per round trip
//	p.SetBlackhole(faultproxy.Both, true)           // no data, sockets open; held data is delivered when it ends
//	p.Reset()                                       // RST on every current connection, both sides
//	p.SetRefuse(true)                               // new connections get ECONNREFUSED
//	p.Normal()                                      // all faults off
//
// Accepted counts accepted connections (pgx also connects to send a cancel request when it
// closes a broken connection, and these count too); Open counts current ones. Close stops the
// proxy and all its goroutines.
//
// # Missing tools
//
// RequireTool(t, name, debianPackage) returns a program's path or fails the test with the
// apt-get line that installs it. Tests never skip for a missing tool; StartPgBouncer's error
// says the same through FindTool.
package pgserver
