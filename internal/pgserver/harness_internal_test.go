package pgserver

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestLocalStartAndClose starts a second local server, times it, and checks that Close stops the
// postmaster and removes the directory.
func TestLocalStartAndClose(t *testing.T) {
	bins, err := findPostgres()
	if err != nil {
		if os.Getenv(EnvDatabase) != "" || dockerStep() != nil {
			t.Skipf("no local PostgreSQL binaries, and the tests use another server: %v", err)
		}
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	s, err := startLocal(ctx, bins, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("local server %s started in %s", s.Version(), time.Since(start))
	defer s.Close()

	if !strings.Contains(s.DSN(), "@127.0.0.1:") || !strings.Contains(s.DSN(), "sslmode=disable") {
		t.Fatalf("DSN %s", redact(s.DSN()))
	}
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	var listen, sockets string
	if err := conn.QueryRow(ctx, "select current_setting('listen_addresses'), current_setting('unix_socket_directories')").Scan(&listen, &sockets); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if listen != "127.0.0.1" {
		t.Errorf("listen_addresses = %q", listen)
	}
	if !strings.Contains(sockets, tempPrefix) {
		t.Errorf("unix_socket_directories = %q, want the temporary directory", sockets)
	}
	if _, err := os.Stat(sockets); err != nil {
		t.Fatal(err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(sockets); !os.IsNotExist(err) {
		t.Errorf("temporary directory still there after Close: %v", err)
	}
	if c, err := pgx.Connect(ctx, s.DSN()); err == nil {
		c.Close(ctx)
		t.Error("server still answers after Close")
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p@h:5/postgres?sslmode=disable", "postgres://u:p@h:5/db1?sslmode=disable"},
		{"postgresql://u@h/x", "postgresql://u@h/db1"},
		{"postgres://u:p@h:5?dbname=x", "postgres://u:p@h:5/db1?dbname=db1"},
		{"host=h user=u dbname=x", "host=h user=u dbname=x dbname='db1'"},
	} {
		got, err := withDatabase(tc.in, "db1")
		if err != nil || got != tc.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestRedactHidesPassword(t *testing.T) {
	got := redact("postgres://u:secret@h:5/db")
	if strings.Contains(got, "secret") || got != "u@h:5/db" {
		t.Fatalf("redact = %q", got)
	}
}

func TestFindBinaryMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := findBinary("pgbouncer", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "pgbouncer not found") {
		t.Fatalf("err = %v", err)
	}
}

func TestNoServerErrorSaysWhatToInstall(t *testing.T) {
	msg := noServerError([]string{"docker: none", "local: none"}).Error()
	for _, want := range []string{"harness: ", "apt-get install -y postgresql", EnvDatabase, "Docker", "local: none"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
}

// TestServerDiesWithProcess kills a process that started a server and checks that the postmaster
// dies with it (Pdeathsig) and that the next harness run removes the files left behind.
func TestServerDiesWithProcess(t *testing.T) {
	if os.Getenv("HARNESS_TEST_CHILD") == "1" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		bins, err := findPostgres()
		if err != nil {
			t.Fatal(err)
		}
		s, err := startLocal(ctx, bins, Options{})
		if err != nil {
			t.Fatal(err)
		}
		_ = s
		matches, _ := filepath.Glob(filepath.Join("/tmp", fmt.Sprintf("%s%d-*", tempPrefix, os.Getpid())))
		matches2, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-*", tempPrefix, os.Getpid())))
		matches = append(matches, matches2...)
		if len(matches) == 0 {
			t.Fatal("no temporary directory")
		}
		fmt.Printf("SERVER %d %s\n", postmasterPID(matches[0]), matches[0])
		time.Sleep(time.Minute) // killed by the parent
		return
	}
	if _, err := findPostgres(); err != nil {
		t.Skipf("needs local PostgreSQL binaries: %v", err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "HARNESS_TEST_CHILD=1", EnvDatabase+"=", EnvDocker+"=0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var pid int
	var dir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "SERVER" {
			pid, _ = strconv.Atoi(f[1])
			dir = f[2]
			break
		}
	}
	if pid <= 0 || dir == "" {
		t.Fatal("the child did not report a server")
	}
	if !alive(pid) {
		t.Fatalf("postmaster %d not running", pid)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("postmaster %d outlived its parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	removeStale()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("stale directory %s not removed: %v", dir, err)
	}
}

// TestDockerForced: PGXLANES_TEST_DOCKER=1 makes Start fail, not fall back to local binaries,
// when the Docker step cannot run.
func TestDockerForced(t *testing.T) {
	t.Setenv(EnvDatabase, "")
	t.Setenv(EnvDocker, "1")
	if d := dockerStep(); d != nil && d.Ready(context.Background()) == nil {
		t.Skip("a Docker engine answers here; the forced path is tested by make test-containers")
	}
	_, err := Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "PGXLANES_TEST_DOCKER=1 forces the Docker step") {
		t.Fatalf("Start with the Docker step forced and unavailable: %v", err)
	}
}
