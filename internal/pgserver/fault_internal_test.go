package pgserver

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFrozenServerDiesWithProcess freezes a server in a child process and kills the child with
// SIGKILL, so that no cleanup of the child runs: the thaw guard must resume the frozen
// processes, which then die of the postmaster's parent-death signal.
func TestFrozenServerDiesWithProcess(t *testing.T) {
	if os.Getenv("HARNESS_TEST_FREEZE_CHILD") == "1" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := StartLocal(ctx, Options{})
		require.NoError(t, err)
		require.NoError(t, s.Freeze())
		s.local.mu.Lock()
		guard := s.local.frozen.guard.cmd.Process.Pid
		s.local.mu.Unlock()
		kids, err := children(s.PID())
		require.NoError(t, err)
		fmt.Printf("FROZEN %d %d %s\n", s.PID(), guard, strings.Trim(fmt.Sprint(kids), "[]"))
		time.Sleep(time.Minute) // killed by the parent
		return
	}
	if _, err := findPostgres(); err != nil {
		t.Fatalf("needs local PostgreSQL binaries: %v", err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestFrozenServerDiesWithProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "HARNESS_TEST_FREEZE_CHILD=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	var pids []int // the postmaster first, then its children
	guard := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "FROZEN" {
			for i, s := range f[1:] {
				pid, err := strconv.Atoi(s)
				require.NoError(t, err)
				if i == 1 {
					guard = pid
				} else {
					pids = append(pids, pid)
				}
			}
			break
		}
	}
	require.Greater(t, len(pids), 2, "the child did not report a frozen server with children")
	for _, pid := range pids {
		state, _, err := procState(pid)
		require.NoError(t, err)
		require.Equal(t, byte('T'), state, "process %d is not stopped", pid)
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range append(pids, guard) {
		for alive(pid) {
			if time.Now().After(deadline) {
				// Resume what the child froze, so that it dies of its parent's death, before
				// failing.
				for _, p := range pids {
					_ = syscall.Kill(p, syscall.SIGCONT)
				}
				_ = syscall.Kill(guard, syscall.SIGKILL)
				t.Fatalf("process %d outlived the test process that froze it", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	removeStale()
}

func TestProcState(t *testing.T) {
	state, ppid, err := procState(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, os.Getppid(), ppid)
	assert.Contains(t, "RS", string(state))
	kids, err := children(os.Getppid())
	require.NoError(t, err)
	assert.Contains(t, kids, os.Getpid())
	_, _, err = procState(1 << 30)
	assert.Error(t, err)
}

func TestStartPgBouncerSaysWhatToInstall(t *testing.T) {
	saved := toolDirs
	toolDirs = []string{t.TempDir()}
	t.Cleanup(func() { toolDirs = saved })
	t.Setenv("PATH", t.TempDir())
	_, _, err := StartPgBouncer(context.Background(), "postgres://u:p@127.0.0.1:5/db", "session")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "pgbouncer not found")
	assert.Contains(t, err.Error(), "apt-get install -y pgbouncer")
	assert.NotContains(t, err.Error(), ":p@")
}

func TestWithHostPort(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p@127.0.0.1:5/db?sslmode=disable", "postgres://u:p@127.0.0.1:9/db?sslmode=disable"},
		{"postgres://u:p@localhost/db?host=localhost&port=5", "postgres://u:p@127.0.0.1:9/db"},
		{"host=127.0.0.1 port=5 user=u", "host=127.0.0.1 port=5 user=u host=127.0.0.1 port=9 hostaddr=127.0.0.1"},
	} {
		got, err := withHostPort(tc.in, "127.0.0.1:9")
		require.NoError(t, err)
		assert.Equal(t, tc.want, got)
	}
}
