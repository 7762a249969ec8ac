package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNormalizeArgs(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{nil, []string{"postgres"}},
		{[]string{"postgres", "-c", "fsync=off"}, []string{"postgres", "-c", "fsync=off"}},
		{[]string{"-c", "fsync=off"}, []string{"postgres", "-c", "fsync=off"}},
		{[]string{"psql", "--version"}, []string{"psql", "--version"}},
	} {
		assert.Equal(t, tc.want, normalizeArgs(tc.in), "%q", tc.in)
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigFromEnv(t *testing.T) {
	c, err := configFromEnv(env(map[string]string{"POSTGRES_PASSWORD": "pw"}))
	require.NoError(t, err)
	assert.Equal(t, config{user: "postgres", password: "pw", database: "postgres",
		authMethod: "scram-sha-256", initdbArgs: []string{}, dataDir: "/var/lib/postgresql/data"}, c)

	c, err = configFromEnv(env(map[string]string{"POSTGRES_PASSWORD": "pw", "POSTGRES_USER": "alice",
		"POSTGRES_INITDB_ARGS": "--data-checksums  -E LATIN1", "PGDATA": "/data"}))
	require.NoError(t, err)
	assert.Equal(t, "alice", c.database, "POSTGRES_DB defaults to the user's name")
	assert.Equal(t, []string{"--data-checksums", "-E", "LATIN1"}, c.initdbArgs)
	assert.Equal(t, "/data", c.dataDir)

	_, err = configFromEnv(env(nil))
	require.Error(t, err, "no password")
	assert.Contains(t, err.Error(), "POSTGRES_PASSWORD")

	c, err = configFromEnv(env(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}))
	require.NoError(t, err, "trust needs no password")
	assert.Equal(t, "trust", c.authMethod)
}

func TestInitdbCommand(t *testing.T) {
	c := config{user: "alice", authMethod: "scram-sha-256", dataDir: "/d", initdbArgs: []string{"--locale=C.UTF-8"}}
	got := strings.Join(c.initdbCommand("/tmp/pw"), " ")
	assert.Equal(t, "initdb -D /d --username=alice --encoding=UTF8 --locale=C --no-sync --auth-local=trust "+
		"--pwfile=/tmp/pw --auth-host=scram-sha-256 --locale=C.UTF-8", got,
		"POSTGRES_INITDB_ARGS come last, so that they override the defaults")

	c.authMethod = "trust"
	got = strings.Join(c.initdbCommand(""), " ")
	assert.NotContains(t, got, "--pwfile")
	assert.Contains(t, got, "--auth-host=trust")
}

func TestInitScripts(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"02-b.sql", "01-a.sql"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o644))
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	got, err := initScripts(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(dir, "01-a.sql"), filepath.Join(dir, "02-b.sql")}, got)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "03-c.sh"), nil, 0o755))
	_, err = initScripts(dir)
	require.Error(t, err, "a script this image cannot run is an error, not skipped")
	assert.Contains(t, err.Error(), "03-c.sh")

	got, err = initScripts(filepath.Join(dir, "missing"))
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestQuoteIdent(t *testing.T) {
	assert.Equal(t, `"app"`, quoteIdent("app"))
	assert.Equal(t, `"a""b"`, quoteIdent(`a"b`))
}

func TestPostmasterReady(t *testing.T) {
	dir := t.TempDir()
	assert.False(t, postmasterReady(dir), "no postmaster.pid")
	pid := func(status string) {
		lines := "42\n" + dir + "\n1700000000\n5432\n/tmp\n\n  5432001     32768\n" + status + "\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(lines), 0o600))
	}
	pid("starting")
	assert.False(t, postmasterReady(dir))
	pid("ready   ")
	assert.True(t, postmasterReady(dir))
}
