package pgxlanes

import (
	"regexp"
	"strings"
	"testing"
)

// pwSlot marks where a seed's password goes.
const pwSlot = "{pw}"

// pwPosition matches a template whose password slot is in password position, in the spellings
// people write: keyword/value with spaces around '=', quoted, after an escaped space; a URL's
// user info; a URL's password parameter.
var pwPosition = regexp.MustCompile(`(?:password\s*=\s*(?:'|[^\s'=]*\\ )?|//[^:@/?\s]*:[^@/?\s]*|[?&]password=[^&\s]*)\{pw\}`)

// FuzzParseConfig: ParseConfig, and resolve on what it accepts, never panic; every error names
// the connection string or the parameter (or Config field) at fault; and no error holds the
// password. The password is the second argument, put in the template at {pw}; the no-password
// check applies when the slot is in password position and the password is nowhere else.
func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		// Keyword/value, the spellings of TestParseConfigErrorsNeverHoldThePassword.
		"password = '{pw}' pool_max_conns=bad",
		"password ={pw} pool_max_conns=bad",
		"password= {pw} pool_max_conns=bad",
		`password=x\ {pw} pool_max_conns=bad`,
		"host=127.0.0.1 port=5432 user=app password={pw} dbname=app sslmode=disable",
		"host=127.0.0.1 user=app password={pw} dbname=app pool_max_conns=8 lane_tx_budget=10",
		"host=127.0.0.1 password={pw} lane_short_reserved=-1",
		"host=127.0.0.1 password={pw} lane_tx_acquire_timeout=soon",
		"host=127.0.0.1 password={pw} lane_long_over_budget=kill",
		"host=127.0.0.1 password='{pw} sslmode=bogus",
		"host=127.0.0.1 password={pw} port=notaport",
		"host=127.0.0.1 password={pw} pool_max_conn_lifetime=forever lane_bulk_reserved=1",
		"host=127.0.0.1 password={pw} pgxlanes_transaction_pooler=maybe",
		"host=127.0.0.1 password={pw} lane_short_reserved=9 pool_max_conns=4",
		"host=127.0.0.1 password={pw} lane_tx_max_conns=100 pool_max_conns=4",
		"host=127.0.0.1 password={pw} lane_short_statement_timeout=0 lane_short_budget=0",
		// URL form.
		"postgres://app:{pw}@127.0.0.1:5432/app?sslmode=disable",
		"postgres://app:{pw}@127.0.0.1:5432/app?pool_max_conns=bad",
		"postgres://app:{pw}@127.0.0.1:notaport/app",
		"postgres://app:{pw}@[::1/app",
		"postgresql://app:{pw}@127.0.0.1/app?pool_max_conns=0",
		"postgres://app@127.0.0.1/app?password={pw}&lane_tx_budget=-1s",
		"postgres://app:{pw}@127.0.0.1/app?lane_short_acquire_timeout=1&lane_tx_over_budget=flag",
		"postgres://app:{pw}@127.0.0.1/app?lane_long_fleet_max_conns=x&lane_short_slow_threshold=250ms",
		"postgres://app:{pw}@127.0.0.1/app?lane_short=1",
		"postgres://app:{pw}@127.0.0.1/app?pgxlanes_cancel_requests=no",
		"postgres://app:{pw}@127.0.0.1,127.0.0.2:5433/app?target_session_attrs=bogus",
		"postgres://app:{pw}@127.0.0.1/app?pool_max_conns=2147483648",
		"postgres://app:{pw}@127.0.0.1/app?pool_max_conns=2147483647&lane_short_max_waiters=99999999999999999999",
	} {
		f.Add(seed, "S3cretPW")
	}
	f.Fuzz(func(t *testing.T, template, password string) {
		dsn := strings.ReplaceAll(template, pwSlot, password)
		cfg, err := ParseConfig(dsn)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "pgxlanes: connection string: ") &&
				!strings.HasPrefix(msg, "pgxlanes: DSN parameter ") &&
				msg != "pgxlanes: invalid connection string" {
				t.Fatalf("ParseConfig(%q): the error names neither the connection string nor a parameter: %v", dsn, err)
			}
			checkNoPassword(t, template, password, err.Error(), func(dsn string) string {
				if _, err := ParseConfig(dsn); err != nil {
					return err.Error()
				}
				return ""
			})
			return
		}
		_, err = cfg.resolve()
		if err == nil {
			return
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "pgxlanes: ") ||
			!strings.Contains(msg, "(pool_max_conns)") && !strings.Contains(msg, "(lane_") {
			t.Fatalf("resolve of %q: the error names no parameter: %v", dsn, err)
		}
		checkNoPassword(t, template, password, msg, func(dsn string) string {
			c, err := ParseConfig(dsn)
			if err != nil {
				return err.Error()
			}
			if _, err := c.resolve(); err != nil {
				return err.Error()
			}
			return ""
		})
	})
}

// checkNoPassword fails t if msg, the error for template with password in its slot, holds the
// password, when the slot is in password position and the password appears nowhere else in
// the template.
func checkNoPassword(t *testing.T, template, password, msg string, errOf func(dsn string) string) {
	t.Helper()
	if len(password) < 6 || strings.Count(template, pwSlot) != 1 || !pwPosition.MatchString(template) ||
		strings.Contains(strings.ReplaceAll(template, pwSlot, ""), password) {
		return
	}
	for _, r := range password {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return // quotes, spaces, '&' and the like change how the DSN parses
		}
	}
	if !strings.Contains(msg, password) {
		return
	}
	// A password that the error made with another password of the same shape holds too is a
	// word of the message (a host, a parameter name), not a leak.
	other := strings.Repeat("Q", len(password))
	if !strings.Contains(errOf(strings.ReplaceAll(template, pwSlot, other)), password) {
		t.Fatalf("the error for %q holds the password %q: %s", strings.ReplaceAll(template, pwSlot, password), password, msg)
	}
}
