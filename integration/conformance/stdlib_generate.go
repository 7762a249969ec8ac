package conformance

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
)

const (
	pgxStdlibPath   = pgxModule + "/stdlib"
	lanesStdlibPath = "github.com/pgxlanes/pgxlanes/stdlib"
	lanesStdlibName = "lanesstdlib"
)

// stdlibBridge is added to pgx's rewritten database/sql tests: every *sql.DB that pgx's tests
// open with stdlib.OpenDB comes from the bridge, on a pgxlanes pool built from the same
// connection string with the config's query exec mode and tracer; closing the *sql.DB closes the
// pool. pgx's stdlib options (connection hooks) have no meaning on a bridge over a pool: a DB
// opened with one fails every connection attempt, naming it.
const stdlibBridge = `package stdlib_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
	lanesstdlib "github.com/pgxlanes/pgxlanes/stdlib"
)

// closingConnector closes the bridge's pool when database/sql closes the *sql.DB. pgx's tests
// close a *sql.DB with a sql.Conn still open (a pinned session, which Pool.Close waits for, as
// pgxpool's does): the pool is closed in the background, in a test process of its own.
type closingConnector struct {
	driver.Connector
	pool *pgxlanes.Pool
}

func (c closingConnector) Close() error {
	go c.pool.Close()
	return nil
}

type failingConnector struct{ err error }

func (c failingConnector) Connect(context.Context) (driver.Conn, error) { return nil, c.err }
func (c failingConnector) Driver() driver.Driver                      { return lanesstdlib.Driver{} }

// bridgeOpenDB stands in for pgx's stdlib.OpenDB.
func bridgeOpenDB(config pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	if len(opts) > 0 {
		return sql.OpenDB(failingConnector{errors.New("conformance: pgx's stdlib.OptionOpenDB hooks do not apply to the bridge")})
	}
	cfg, err := pgxlanes.ParseConfig(config.ConnString())
	if err != nil {
		return sql.OpenDB(failingConnector{err})
	}
	cfg.ConnConfig.DefaultQueryExecMode = config.DefaultQueryExecMode
	cfg.ConnConfig.Tracer = config.Tracer
	pool, err := pgxlanes.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return sql.OpenDB(failingConnector{err})
	}
	return sql.OpenDB(closingConnector{Connector: lanesstdlib.GetPoolConnector(pool), pool: pool})
}
`

// generateStdlib writes pgx's database/sql tests (stdlib/sql_test.go) from pgxDir into dst,
// rewritten so that every *sql.DB of stdlib.OpenDB comes from the bridge (bridgeOpenDB) and the
// driver connection type asserted through sql.Conn.Raw is the bridge's *stdlib.Conn: the two
// changes a user makes. sql.Open("pgx", ...) and stdlib.OpenDBFromPool(pgxpool) stay pgx's: they
// test pgx's driver registration and pgxpool, which a bridge has no counterpart of.
func generateStdlib(pgxDir, dst string) error {
	from := filepath.Join(pgxDir, "stdlib", "sql_test.go")
	src, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	out, err := rewriteStdlib(src)
	if err != nil {
		return fmt.Errorf("conformance: %s: %w", from, err)
	}
	if err := os.WriteFile(filepath.Join(dst, "sql_test.go"), out, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dst, "bridge_test.go"), []byte(stdlibBridge), 0o644)
}

// rewriteStdlib turns stdlib.OpenDB into bridgeOpenDB and stdlib.Conn into the bridge's Conn.
func rewriteStdlib(src []byte) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "stdlib/sql_test.go", src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var spec *ast.ImportSpec
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == pgxStdlibPath {
			if imp.Name != nil {
				return nil, fmt.Errorf("pgx's stdlib is imported as %s", imp.Name.Name)
			}
			spec = imp
		}
	}
	if spec == nil {
		return nil, fmt.Errorf("pgx's stdlib is not imported")
	}
	var openDB, conn int
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && isStdlibSel(sel, "OpenDB") {
				n.Fun = ast.NewIdent("bridgeOpenDB")
				openDB++
			}
		case *ast.SelectorExpr:
			if isStdlibSel(n, "Conn") {
				n.X.(*ast.Ident).Name = lanesStdlibName
				conn++
			}
		}
		return true
	})
	if openDB == 0 || conn == 0 {
		return nil, fmt.Errorf("found %d stdlib.OpenDB and %d stdlib.Conn to rewrite", openDB, conn)
	}
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.IMPORT && gd.Lparen.IsValid() {
			gd.Specs = append(gd.Specs, &ast.ImportSpec{
				Name: ast.NewIdent(lanesStdlibName),
				Path: &ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(lanesStdlibPath), ValuePos: spec.End()},
			})
			break
		}
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, generatedNotice, pgxStdlibPath+"/sql_test.go")
	if err := format.Node(&buf, fset, f); err != nil {
		return nil, err
	}
	return format.Source(buf.Bytes())
}

func isStdlibSel(sel *ast.SelectorExpr, name string) bool {
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "stdlib" && sel.Sel.Name == name
}
