// Package conformance runs pgx's own pgxpool tests against pgxlanes, the check behind the
// drop-in promise.
//
// TestPgxpoolConformance takes pgxpool/*_test.go from the module cache, at the pgx version the
// integration module requires, and rewrites them mechanically: the selectors pgxpool.New,
// NewWithConfig, ParseConfig, Conn and Config become pgxlanes.*; everything else, the tracer
// interfaces and their *pgxpool.Pool included, stays pgxpool's. It compiles the rewritten package
// and, as a control, pgx's untouched pgxpool tests, once each (go test -c), lists the tests with
// -test.list and runs every test in a process of its own with a timeout and a memory ceiling, so
// that a crash or a hang costs one test, not the stage.
//
// The rewritten package lives in a directory _gen-* next to this file, created for the run and
// removed after it. Inside the integration module it builds with the module's replace directives
// (pgxlanes from this checkout) and its requirements (testify); the leading underscore keeps it
// out of ./... patterns and the .gitignore keeps it out of git. pgx's tests import one internal
// package of pgx (internal/pgmock), which only code under github.com/jackc/pgx/v5 may import, and
// the go command refuses overlays inside the module cache: the generator copies such packages
// into _gen-*/internal/ and points the imports there.
//
// Every lane-rule difference is listed in allowlist.txt, one "TestName: reason" line each. The
// stage fails if a test fails that is not listed, if a listed test passes (the list must stay
// honest), if a listed test does not exist, or if a test fails on both pgxlanes and the control
// (then the environment is broken, not pgxlanes). A failed test is run once more before it
// counts. A control test that fails twice where pgxlanes passed is logged, not a failure: pgx's
// timing-sensitive tests (stdlib's TestBeginTxContextCancel) do that on a loaded machine, and
// the stage checks pgxlanes, not pgx.
//
// TestStdlibConformance does the same for pgx's database/sql tests (stdlib/sql_test.go): every
// *sql.DB of stdlib.OpenDB comes from the bridge (github.com/pgxlanes/pgxlanes/stdlib over a
// pgxlanes pool with the config's query exec mode and tracer), and the driver connection that
// sql.Conn.Raw hands out is the bridge's *stdlib.Conn; its control is pgx's untouched stdlib
// tests, and its allowlist allowlist_stdlib.txt.
package conformance
