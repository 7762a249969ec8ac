package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Beginner is what RetryTx begins its transactions on: a *Pool, a *pgxpool.Pool or a *pgx.Conn.
// A pgx.Tx is not one on purpose: a serialization failure aborts the whole transaction, so a
// savepoint cannot be retried on PostgreSQL.
type Beginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// Codes that RetryTx gives to errors that are retryable without a SQLSTATE of their own, in
// RetryEvent.Code and in the code label of the metrics.
const (
	// RetryCodeConn: pgx marks the error safe to retry (pgconn.SafeToRetry): the connection failed
	// before anything of the request was sent.
	RetryCodeConn = "conn"
	// RetryCodeAcquireTimeout and RetryCodeLaneFull: the lane gave no connection
	// (ErrAcquireTimeout, ErrLaneFull); retried only with RetryOptions.RetryAcquire.
	RetryCodeAcquireTimeout = "acquire_timeout"
	RetryCodeLaneFull       = "lane_full"
)

// Why RetryTx gave up, in RetryError.Reason, RetryEvent.Reason and the reason label of the metrics.
const (
	RetryReasonMaxAttempts = "max_attempts"   // RetryOptions.MaxAttempts attempts ran
	RetryReasonMaxElapsed  = "max_elapsed"    // the next attempt would start past RetryOptions.MaxElapsed
	RetryReasonDeadline    = "deadline"       // the next attempt would start past ctx's deadline, or the deadline passed
	RetryReasonCanceled    = "canceled"       // ctx was cancelled during a pause
	RetryReasonUnknown     = "commit_unknown" // a Commit's outcome is unknown: ErrRetryCommitUnknown, not a cap
)

// Sentinels of RetryError. Use errors.Is.
var (
	// ErrRetryGaveUp: every attempt failed with a retryable error until a cap (attempts, elapsed
	// time, ctx's deadline) stopped RetryTx. The last attempt's error is wrapped too.
	ErrRetryGaveUp = errors.New("pgxlanes: retry gave up")
	// ErrRetryCommitUnknown: a Commit failed in a way that leaves its outcome unknown (the
	// connection was lost or ctx ended while COMMIT was in flight): the transaction may have
	// committed. RetryTx never retries it; the caller decides, for example by looking up an
	// idempotency key.
	ErrRetryCommitUnknown = errors.New("pgxlanes: commit outcome unknown")
)

// RetryError is returned by RetryTx when it stops on a retryable error (ErrRetryGaveUp) or on a
// Commit whose outcome is unknown (ErrRetryCommitUnknown). errors.Is and errors.As see the sentinel
// and, through Err, the last attempt's error: a *pgconn.PgError with its SQLSTATE, an
// *AcquireError, ctx's error.
type RetryError struct {
	Attempts int           // attempts run, the last included
	Elapsed  time.Duration // from the call to the end of the last attempt
	Reason   string        // one of the RetryReason constants
	Code     string        // the last error's code: a SQLSTATE or a RetryCode constant; "" when none
	Err      error         // the last attempt's error
}

func (e *RetryError) Error() string {
	if e.Reason == RetryReasonUnknown {
		return fmt.Sprintf("pgxlanes: commit outcome unknown at attempt %d, not retried: %v", e.Attempts, e.Err)
	}
	return fmt.Sprintf("pgxlanes: retry gave up after %d attempt(s) in %v (%s): %v", e.Attempts, e.Elapsed.Round(time.Millisecond), e.Reason, e.Err)
}

// Unwrap returns the sentinel, the last attempt's error and, when ctx stopped the retries
// (RetryReasonCanceled, RetryReasonDeadline), context.Canceled or context.DeadlineExceeded, so
// that errors.Is(err, context.DeadlineExceeded) holds when a pause would have crossed the deadline.
func (e *RetryError) Unwrap() []error {
	switch e.Reason {
	case RetryReasonUnknown:
		return []error{ErrRetryCommitUnknown, e.Err}
	case RetryReasonCanceled:
		return []error{ErrRetryGaveUp, e.Err, context.Canceled}
	case RetryReasonDeadline:
		return []error{ErrRetryGaveUp, e.Err, context.DeadlineExceeded}
	}
	return []error{ErrRetryGaveUp, e.Err}
}

// Defaults of RetryOptions.
const (
	DefaultRetryMaxAttempts = 10
	DefaultRetryMaxElapsed  = 10 * time.Second
	DefaultRetryBaseDelay   = 5 * time.Millisecond
	DefaultRetryMaxDelay    = time.Second
)

// DefaultRetryCodes returns the SQLSTATEs retried when RetryOptions.RetryCodes is nil:
// serialization_failure (40001) and deadlock_detected (40P01), the two that PostgreSQL's manual
// (§13.5) says to retry by running the whole transaction again.
func DefaultRetryCodes() []string { return []string{"40001", "40P01"} }

// RetryOptions configure RetryTx. The zero value gives the defaults documented on each field.
//
// The pause before retry n (n = 1 after the first attempt) is full jitter: a uniformly random
// duration in [0, min(MaxDelay, BaseDelay·2^(n-1))). Jitter spreads the callers that collided
// over the pause, so they do not collide again in step; a fixed pause does (README, "Retrying
// transactions", has the figures).
type RetryOptions struct {
	// MaxAttempts caps the attempts, the first included: 1 means no retry. Default
	// DefaultRetryMaxAttempts (10).
	MaxAttempts int
	// MaxElapsed caps the time from the call to the start of the last attempt: no attempt starts
	// later, and a pause that would end later is not taken. It does not interrupt an attempt; ctx
	// does. Default DefaultRetryMaxElapsed (10 s); Off for none.
	MaxElapsed time.Duration
	// BaseDelay bounds the first pause; each retry doubles the bound, up to MaxDelay. Default
	// DefaultRetryBaseDelay (5 ms).
	BaseDelay time.Duration
	// MaxDelay bounds every pause. Default DefaultRetryMaxDelay (1 s).
	MaxDelay time.Duration
	// RetryCodes are the SQLSTATEs retried; nil means DefaultRetryCodes (40001, 40P01), an empty
	// list none. To add one, append to the defaults: lock_not_available (55P03, a lock timeout)
	// is a candidate; unique_violation (23505) only when the conflict is on a key the transaction
	// chose itself.
	RetryCodes []string
	// RetryAcquire retries an attempt that got no connection because its lane's acquire timed out
	// (ErrAcquireTimeout) or its queue was full (ErrLaneFull). Off by default: those say the pool
	// is overloaded, where retrying adds load and failing fast is usually right.
	RetryAcquire bool
	// Rand replaces the jitter's random source; it must return a value in [0, n). nil uses
	// math/rand/v2. For tests: a Rand that returns n-1 removes the jitter, and with it the spread.
	Rand func(n int64) int64
}

// RetryTx runs fn in a transaction begun on db with txOptions, as pgx.BeginTxFunc does, and runs
// it again in a new transaction when it fails with a retryable error, after a pause (see
// RetryOptions, whose defaults it uses). Each attempt is a transaction of its own: on a *Pool, a
// new lease on its lane (Tx, or the lane ctx names) with its own budget.
//
// An attempt is retried when BEGIN, fn or COMMIT fails with an error whose SQLSTATE is 40001
// (serialization_failure) or 40P01 (deadlock_detected), or when BEGIN or fn fails with an error
// that pgx marks safe to retry (pgconn.SafeToRetry: a connection that failed before the request
// was sent; the transaction did not commit). fn's transaction is rolled back whenever fn returns an
// error or panics. The error is returned, and nothing is retried, when:
//   - it is any other error, fn's own included: returned as it is;
//   - ctx ended: the error of the call it interrupted is returned as it is (it matches ctx's
//     error with errors.Is);
//   - a cap was reached (MaxAttempts, MaxElapsed, or ctx's deadline, which no pause crosses): a
//     *RetryError that matches ErrRetryGaveUp and the last attempt's error;
//   - COMMIT failed with an outcome that cannot be known: a *RetryError that matches
//     ErrRetryCommitUnknown. That is a Commit error that wraps ErrCommitOutcomeUnknown (even
//     over a server's FATAL error: the session was terminated while COMMIT ran), that is a
//     FATAL or PANIC of the server's (pgx's own Commit returns it as it is), or that carries no
//     answer of the server's (no *pgconn.PgError): the connection was lost, or ctx ended, while
//     COMMIT was in flight. The transaction may have committed. pgconn.SafeToRetry does not
//     make a Commit error retryable: pgx marks "conn closed" safe to retry even when COMMIT was
//     sent and committed. When fn ends the transaction itself (its own Commit or Rollback) and
//     then returns an error, that error is taken for a Commit's, by the same rules.
//
// fn may run more than once, so it must have no effect outside its transaction, or only effects
// that are idempotent: keyed with an idempotency key that a unique index makes the transaction
// record once. It should return tx's errors as they are (wrapped with %w is fine) so that their
// SQLSTATE is seen.
//
// ctx bounds the whole: every attempt and every pause. A *Pool reports each attempt to the
// observers that implement RetryObserver (the metrics package counts them).
func RetryTx(ctx context.Context, db Beginner, txOptions pgx.TxOptions, fn func(pgx.Tx) error) error {
	return RetryOptions{}.RetryTx(ctx, db, txOptions, fn)
}

// RetryTx is the package's RetryTx with the options o. Bad options are refused with an error
// that names the field, before any attempt.
func (o RetryOptions) RetryTx(ctx context.Context, db Beginner, txOptions pgx.TxOptions, fn func(pgx.Tx) error) error {
	if v := reflect.ValueOf(db); db == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return errors.New("pgxlanes: RetryTx: db is nil")
	}
	if fn == nil {
		return errors.New("pgxlanes: RetryTx: fn is nil")
	}
	pool, _ := db.(*Pool)
	return o.Do(ctx, pool, func(ctx context.Context) (err, commitErr error) {
		tx, err := db.BeginTx(ctx, txOptions)
		if err != nil {
			return err, nil
		}
		defer func() { _ = tx.Rollback(ctx) }() // after Commit, or on a panic of fn: a no-op or the rollback
		if err := fn(tx); err != nil {
			if errors.Is(tx.Rollback(ctx), pgx.ErrTxClosed) && ctx.Err() == nil {
				// fn ended the transaction itself, by its own Commit or Rollback, before it
				// failed: its error is taken for a Commit's, whose outcome may be unknown
				// (pgx's "conn closed", which pgconn marks safe to retry).
				return nil, err
			}
			return err, nil
		}
		return nil, tx.Commit(ctx)
	})
}

// Do is the loop under RetryTx, for transactions that are not begun on a Beginner (the
// database/sql bridge uses it). attempt runs one whole transaction, begun anew: it returns err
// when the transaction did not commit (BEGIN or the work failed, or the driver refused to send
// COMMIT), and commitErr for the error of its Commit, which Do classifies as RetryTx describes.
// pool, if not nil, is the pool the transactions run on: its observers see each attempt, on the
// lane and tag of ctx. Do returns as RetryTx does.
func (o RetryOptions) Do(ctx context.Context, pool *Pool, attempt func(ctx context.Context) (err, commitErr error)) error {
	o, err := o.resolve()
	if err != nil {
		return err
	}
	if attempt == nil {
		return errors.New("pgxlanes: RetryOptions.Do: attempt is nil")
	}
	r := retrier{o: &o, start: time.Now()}
	if pool != nil && pool.obs.any() {
		r.pool = pool
		var rt route
		_ = pool.route(ctx, Tx, "", &rt) // an invalid lane is for the attempt's Begin to report; rt says Tx
		r.lane, r.tag = rt.lane, rt.tag
	}
	for n := 1; ; n++ {
		err, commitErr := attempt(ctx)
		if err == nil && commitErr == nil {
			r.report(n, RetryCommitted, "", "", 0, nil)
			return nil
		}
		if err == nil {
			if commitUnknown(commitErr) {
				r.report(n, RetryCommitUnknown, "", RetryReasonUnknown, 0, commitErr)
				return &RetryError{Attempts: n, Elapsed: time.Since(r.start), Reason: RetryReasonUnknown, Err: commitErr}
			}
			err = commitErr
		}
		code := o.code(err)
		if code == "" {
			r.report(n, RetryFailed, "", "", 0, err)
			return err
		}
		delay, reason := r.next(ctx, n)
		if reason == "" {
			reason = r.sleep(ctx, delay)
		}
		if reason != "" {
			r.report(n, RetryGaveUp, code, reason, 0, err)
			return &RetryError{Attempts: n, Elapsed: time.Since(r.start), Reason: reason, Code: code, Err: err}
		}
		r.report(n, RetryWillRetry, code, "", delay, err)
	}
}

// resolve returns o with its defaults filled in, or an error that names the bad field.
func (o RetryOptions) resolve() (RetryOptions, error) {
	bad := func(field, format string, args ...any) (RetryOptions, error) {
		return o, fmt.Errorf("pgxlanes: RetryOptions.%s %s", field, fmt.Sprintf(format, args...))
	}
	switch {
	case o.MaxAttempts < 0:
		return bad("MaxAttempts", "must be at least 1, or 0 for the default; got %d", o.MaxAttempts)
	case o.MaxElapsed < 0 && o.MaxElapsed != Off:
		return bad("MaxElapsed", "must be positive, 0 for the default, or Off; got %v", o.MaxElapsed)
	case o.BaseDelay < 0:
		return bad("BaseDelay", "must be positive, or 0 for the default; got %v", o.BaseDelay)
	case o.MaxDelay < 0:
		return bad("MaxDelay", "must be positive, or 0 for the default; got %v", o.MaxDelay)
	}
	for _, c := range o.RetryCodes {
		if !isSQLState(c) {
			return bad("RetryCodes", "holds %q, which is not a SQLSTATE (5 digits or upper-case letters)", c)
		}
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultRetryMaxAttempts
	}
	if o.MaxElapsed == 0 {
		o.MaxElapsed = DefaultRetryMaxElapsed
	}
	if o.BaseDelay == 0 {
		o.BaseDelay = DefaultRetryBaseDelay
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = DefaultRetryMaxDelay
	}
	if o.BaseDelay > o.MaxDelay {
		return bad("BaseDelay", "(%v) must not exceed MaxDelay (%v)", o.BaseDelay, o.MaxDelay)
	}
	if o.RetryCodes == nil {
		o.RetryCodes = DefaultRetryCodes()
	}
	if o.Rand == nil {
		o.Rand = rand.Int64N
	}
	return o, nil
}

func isSQLState(c string) bool {
	if len(c) != 5 {
		return false
	}
	for _, r := range c {
		if (r < '0' || r > '9') && (r < 'A' || r > 'Z') {
			return false
		}
	}
	return true
}

// code returns the code under which err is retried, or "" when it is not retryable. An error
// that matches a context's error is never retried: its ctx ended.
func (o *RetryOptions) code(err error) string {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ""
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		for _, c := range o.RetryCodes {
			if pe.Code == c {
				return c
			}
		}
		return ""
	}
	switch {
	case errors.Is(err, ErrAcquireTimeout):
		if o.RetryAcquire {
			return RetryCodeAcquireTimeout
		}
		return ""
	case errors.Is(err, ErrLaneFull):
		if o.RetryAcquire {
			return RetryCodeLaneFull
		}
		return ""
	case pgconn.SafeToRetry(err):
		return RetryCodeConn
	}
	return ""
}

// commitUnknown reports whether a Commit's error leaves the outcome unknown: it is not an answer
// of the server's, and not one of pgx's and the pool's own refusals to send COMMIT.
//
// pgconn.SafeToRetry is not trusted here: when the connection fails while pgx reads the answer
// to a request it sent, pgx closes it and reports "conn closed", an error it marks safe to retry
// (pgx #2428, #2557). Measured in integration/retry_test.go: COMMIT reached the server and
// committed, and Commit's error was marked safe to retry.
func commitUnknown(err error) bool {
	var pe *pgconn.PgError
	var be *BudgetError
	switch {
	case errors.Is(err, ErrCommitOutcomeUnknown):
		// Commit said so itself: it may wrap a server's error (a FATAL one, the session
		// terminated while COMMIT ran), which the cases below would take for an answer.
		return true
	case errors.Is(err, pgx.ErrTxCommitRollback), errors.Is(err, pgx.ErrTxClosed), errors.Is(err, ErrReleased):
		return false // the transaction had failed, or was ended by fn itself: not this COMMIT's doing
	case errors.As(err, &be) && be.Err == nil:
		return false // the guard ended the transaction; Commit refused to send COMMIT
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// ctx had ended before COMMIT was sent (pgconn marks that one safe to retry), or ended
		// while it was in flight: then the server may have committed.
		return !pgconn.SafeToRetry(err)
	case errors.As(err, &pe):
		// The server answered COMMIT with an error: it rolled back. Not with a FATAL or PANIC:
		// the session ends, and it may end after the commit (a terminate lands once the commit
		// record is written), as pgxlanes' own Commit says (ErrCommitOutcomeUnknown); pgx's
		// returns the server's error as it is.
		return pe.Severity == "FATAL" || pe.Severity == "PANIC"
	}
	return true
}

// retrier is the state of one Do call.
type retrier struct {
	o     *RetryOptions // resolved
	start time.Time
	// pool is the pool whose observers see the attempts, nil when none listens; lane and tag
	// are ctx's route on it.
	pool *Pool
	lane Lane
	tag  string
}

// next returns the pause after attempt n failed with a retryable error, or why no other
// attempt may start.
func (r *retrier) next(ctx context.Context, n int) (time.Duration, string) {
	if n >= r.o.MaxAttempts {
		return 0, RetryReasonMaxAttempts
	}
	delay := r.o.backoff(n)
	now := time.Now()
	if r.o.MaxElapsed > 0 && now.Add(delay).Sub(r.start) > r.o.MaxElapsed {
		return 0, RetryReasonMaxElapsed
	}
	if d, ok := ctx.Deadline(); ok && !now.Add(delay).Before(d) {
		return 0, RetryReasonDeadline
	}
	return delay, ""
}

// backoff returns the pause after the nth attempt: full jitter, uniform in [0, bound) where
// bound = min(MaxDelay, BaseDelay·2^(n-1)).
func (o *RetryOptions) backoff(n int) time.Duration {
	bound := o.MaxDelay
	if shift := n - 1; shift < 62 && o.BaseDelay <= o.MaxDelay>>shift {
		bound = o.BaseDelay << shift
	}
	if bound <= 0 {
		return 0
	}
	return time.Duration(o.Rand(int64(bound)))
}

// sleep pauses for d, or until ctx ends: then it returns the reason to give up.
func (r *retrier) sleep(ctx context.Context, d time.Duration) string {
	if d <= 0 {
		if ctx.Err() != nil {
			return ctxReason(ctx)
		}
		return ""
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ""
	case <-ctx.Done():
		return ctxReason(ctx)
	}
}

func ctxReason(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return RetryReasonDeadline
	}
	return RetryReasonCanceled
}

func (r *retrier) report(n int, outcome RetryOutcome, code, reason string, delay time.Duration, err error) {
	if r.pool == nil {
		return
	}
	e := RetryEvent{Lane: r.lane, Tag: r.tag, Attempt: n, Outcome: outcome, Code: code, Reason: reason,
		Delay: delay, Elapsed: time.Since(r.start), Err: err}
	r.pool.obs.each(func(o Observer) {
		if ro, ok := o.(RetryObserver); ok {
			ro.ObserveRetry(e)
		}
	})
}

// RetryObserver is an optional interface of an Observer: it receives one event per attempt of
// RetryTx (and RetryOptions.Do) run on the pool.
type RetryObserver interface {
	ObserveRetry(RetryEvent)
}

// RetryOutcome is how one attempt of RetryTx ended.
type RetryOutcome uint8

const (
	RetryCommitted     RetryOutcome = iota // the transaction committed; RetryTx returns nil
	RetryWillRetry                         // a retryable error; another attempt follows after Delay
	RetryGaveUp                            // a retryable error, but a cap stopped RetryTx (Reason)
	RetryFailed                            // an error that is not retryable, returned as it is
	RetryCommitUnknown                     // a Commit whose outcome is unknown, returned, never retried
)

var retryOutcomeNames = [...]string{"committed", "retry", "gave_up", "failed", "commit_unknown"}

// String returns "committed", "retry", "gave_up", "failed" or "commit_unknown".
func (o RetryOutcome) String() string {
	if int(o) < len(retryOutcomeNames) {
		return retryOutcomeNames[o]
	}
	return fmt.Sprintf("RetryOutcome(%d)", uint8(o))
}

// RetryEvent describes one attempt of RetryTx.
type RetryEvent struct {
	// Lane and Tag are those of ctx's transactions on the pool (Tx unless ctx names a lane).
	Lane Lane
	Tag  string
	// Attempt is the attempt's number, from 1.
	Attempt int
	Outcome RetryOutcome
	// Code is the retryable error's SQLSTATE or RetryCode constant (RetryWillRetry, RetryGaveUp);
	// Reason is why RetryTx gave up (RetryGaveUp, RetryCommitUnknown): a RetryReason constant.
	Code   string
	Reason string
	// Delay is the pause taken before the next attempt (RetryWillRetry); Elapsed the time since
	// the call, at the end of the attempt or of its pause.
	Delay   time.Duration
	Elapsed time.Duration
	// Err is the attempt's error; nil when it committed.
	Err error
}
