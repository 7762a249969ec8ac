package pgserver

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Options configures a server started by StartLocal or NewLocal. The zero value gives the
// settings of Start's local server.
type Options struct {
	// MaxConnections is the server's max_connections. 0 means the harness default, 300. The
	// harness's user postgres is a superuser, so it may use all of them, including the
	// superuser_reserved_connections (3 by default); MaxConnections must exceed that reserve,
	// which PostgreSQL requires. A pool larger than MaxConnections gets "sorry, too many clients
	// already" (SQLSTATE 53300).
	MaxConnections int

	// Settings are extra server settings, passed as -c name=value after the harness's own, so
	// that they override them (fsync, shared_buffers, log_min_messages, ...). The settings that
	// place the server (port, listen_addresses, unix_socket_directories, data_directory and the
	// configuration files) belong to the harness, and max_connections is set by MaxConnections.
	Settings map[string]string

	// TLS turns the server's TLS on, with a certificate for 127.0.0.1 and localhost signed by a
	// CA made at start (Server.CA). The server's DSN then asks for sslmode=verify-full against
	// that CA.
	TLS bool
	// HostSSLOnly makes pg_hba.conf accept TCP clients over TLS with SCRAM-SHA-256 alone
	// (hostssl ... scram-sha-256, no host line): a client without TLS is refused. It needs TLS.
	HostSSLOnly bool
}

// defaultMaxConnections is max_connections when Options.MaxConnections is 0.
const defaultMaxConnections = 300

// ownedSettings are settings Options.Settings may not give; the value says why.
var ownedSettings = map[string]string{
	"port":                    "the harness chooses the port",
	"listen_addresses":        "the harness listens on 127.0.0.1 only",
	"unix_socket_directories": "the harness puts the socket in its directory",
	"data_directory":          "the harness owns the data directory",
	"config_file":             "the harness owns the configuration",
	"hba_file":                "the harness owns the configuration",
	"ident_file":              "the harness owns the configuration",
	"max_connections":         "use Options.MaxConnections",
}

var settingNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// args validates o and returns the postgres arguments it adds to the harness's own: -c pairs in
// name order, so that the command line is the same from run to run.
func (o Options) args() ([]string, error) {
	if o.HostSSLOnly && !o.TLS {
		return nil, errors.New("harness: Options.HostSSLOnly needs Options.TLS")
	}
	reserved := 3 // superuser_reserved_connections' default
	names := slices.Sorted(maps.Keys(o.Settings))
	for _, name := range names {
		if !settingNameRE.MatchString(name) {
			return nil, fmt.Errorf("harness: Options.Settings: %q is not a setting name", name)
		}
		lower := strings.ToLower(name)
		if why, ok := ownedSettings[lower]; ok {
			return nil, fmt.Errorf("harness: Options.Settings: %s cannot be set: %s", name, why)
		}
		if lower == "superuser_reserved_connections" {
			n, err := strconv.Atoi(o.Settings[name])
			if err != nil {
				return nil, fmt.Errorf("harness: Options.Settings: %s = %q is not an integer", name, o.Settings[name])
			}
			reserved = n
		}
	}
	maxConns := o.MaxConnections
	switch {
	case maxConns == 0:
		maxConns = defaultMaxConnections
	case maxConns < 0:
		return nil, fmt.Errorf("harness: Options.MaxConnections: %d is negative", maxConns)
	case maxConns <= reserved:
		return nil, fmt.Errorf("harness: Options.MaxConnections: %d must exceed superuser_reserved_connections (%d); "+
			"lower that through Options.Settings for a smaller server", maxConns, reserved)
	}
	args := []string{"-c", "max_connections=" + strconv.Itoa(maxConns)}
	for _, name := range names {
		args = append(args, "-c", name+"="+o.Settings[name])
	}
	return args, nil
}
