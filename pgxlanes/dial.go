package pgxlanes

import (
	"context"
	"maps"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// openSideSession opens a session outside the lanes (the guard's, which also serves the fleet's
// slots and the lock-holder lookups) the way pgxpool opens the pool's connections: on a copy of
// base's ConnConfig, after base's BeforeConnect, so that a password the hook supplies (an AWS RDS
// IAM or Azure AD token) is fresh for every session. Everything else the user set is kept:
// DialFunc, LookupFunc, AfterNetConnect, TLS and channel binding, ValidateConnect
// (target_session_attrs) and the multi-host fallbacks. Only the user's tracer is dropped (tracers
// see the user's statements only), application_name is appName so that the session is
// recognisable in pg_stat_activity, and the DSN's statement_timeout and lock_timeout are left out:
// the session's own statements wait for a terminate to complete and are bounded by ctx. ctx
// bounds the connect, BeforeConnect included; ConnectTimeout bounds each attempt, as in pgx.
func openSideSession(ctx context.Context, base *pgxpool.Config, appName string) (*pgx.Conn, error) {
	cc := base.ConnConfig.Copy()
	cc.RuntimeParams = maps.Clone(cc.RuntimeParams)
	if base.BeforeConnect != nil {
		if err := base.BeforeConnect(ctx, cc); err != nil {
			return nil, err
		}
	}
	cc.Tracer = nil
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	delete(cc.RuntimeParams, "statement_timeout")
	delete(cc.RuntimeParams, "lock_timeout")
	cc.RuntimeParams["application_name"] = appName
	return pgx.ConnectConfig(ctx, cc)
}
