package pgserver

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
)

// Proxy is a fault-injecting TCP proxy in front of a server (see package faultproxy for the
// faults: SetLatency, SetBlackhole, SetRefuse, Reset, Normal), with a DSN that reaches the same
// server, user, password and database through it.
type Proxy struct {
	*faultproxy.Proxy
	dsn string
}

// DSN is the DSN given to StartProxy with its host and port replaced by the proxy's.
func (p *Proxy) DSN() string { return p.dsn }

// StartProxy starts a proxy on 127.0.0.1 in front of the server of dsn, which must name one TCP
// host on a loopback address (as every harness server does). Close stops it.
func StartProxy(dsn string) (*Proxy, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		// The parse error may quote the DSN, password included: do not wrap it.
		return nil, errors.New("harness: proxy: invalid DSN")
	}
	// Fallbacks repeat the host for sslmode=prefer; other hosts are a list the proxy cannot follow.
	for _, fb := range cfg.Fallbacks {
		if fb.Host != cfg.Host || fb.Port != cfg.Port {
			return nil, fmt.Errorf("harness: proxy: the DSN %s names more than one host", redact(dsn))
		}
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return nil, fmt.Errorf("harness: proxy: the DSN %s names a Unix socket, not a TCP host", redact(dsn))
	}
	fp, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		return nil, fmt.Errorf("harness: proxy: %w", err)
	}
	pdsn, err := withHostPort(dsn, fp.Addr())
	if err != nil {
		fp.Close()
		return nil, err
	}
	return &Proxy{Proxy: fp, dsn: pdsn}, nil
}

// NewProxy starts a proxy in front of the server of dsn, like StartProxy, and closes it when tb's
// cleanups run. It fails tb if the proxy cannot start.
func NewProxy(tb testing.TB, dsn string) *Proxy {
	tb.Helper()
	p, err := StartProxy(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Error(err)
		}
	})
	return p
}

// withHostPort returns dsn with its host and port replaced by hostPort. It keeps the form of dsn:
// URL or keyword/value.
func withHostPort(dsn, hostPort string) (string, error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "", fmt.Errorf("harness: proxy: address %q: %w", hostPort, err)
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("harness: proxy: the DSN is not a valid URL")
		}
		u.Host = hostPort
		q := u.Query()
		if q.Has("host") || q.Has("port") || q.Has("hostaddr") {
			q.Del("host")
			q.Del("port")
			q.Del("hostaddr")
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return fmt.Sprintf("%s host=%s port=%s hostaddr=%s", dsn, host, port, host), nil
}
