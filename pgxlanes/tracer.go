package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// withoutAcquire is the user's tracer as the pgxpool under the lanes sees it: every tracer
// interface of pgx and pgxpool but AcquireTracer, which pgxlanes calls itself around the whole
// acquire, lane wait included. A method of an interface the user's tracer does not implement
// does nothing, which is what pgx does when the interface is missing.
type withoutAcquire struct{ t pgx.QueryTracer }

func (w withoutAcquire) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return w.t.TraceQueryStart(ctx, c, d)
}

func (w withoutAcquire) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	w.t.TraceQueryEnd(ctx, c, d)
}

func (w withoutAcquire) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if t, ok := w.t.(pgx.BatchTracer); ok {
		return t.TraceBatchStart(ctx, c, d)
	}
	return ctx
}

func (w withoutAcquire) TraceBatchQuery(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	if t, ok := w.t.(pgx.BatchTracer); ok {
		t.TraceBatchQuery(ctx, c, d)
	}
}

func (w withoutAcquire) TraceBatchEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchEndData) {
	if t, ok := w.t.(pgx.BatchTracer); ok {
		t.TraceBatchEnd(ctx, c, d)
	}
}

func (w withoutAcquire) TraceCopyFromStart(ctx context.Context, c *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	if t, ok := w.t.(pgx.CopyFromTracer); ok {
		return t.TraceCopyFromStart(ctx, c, d)
	}
	return ctx
}

func (w withoutAcquire) TraceCopyFromEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceCopyFromEndData) {
	if t, ok := w.t.(pgx.CopyFromTracer); ok {
		t.TraceCopyFromEnd(ctx, c, d)
	}
}

func (w withoutAcquire) TracePrepareStart(ctx context.Context, c *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	if t, ok := w.t.(pgx.PrepareTracer); ok {
		return t.TracePrepareStart(ctx, c, d)
	}
	return ctx
}

func (w withoutAcquire) TracePrepareEnd(ctx context.Context, c *pgx.Conn, d pgx.TracePrepareEndData) {
	if t, ok := w.t.(pgx.PrepareTracer); ok {
		t.TracePrepareEnd(ctx, c, d)
	}
}

func (w withoutAcquire) TraceConnectStart(ctx context.Context, d pgx.TraceConnectStartData) context.Context {
	if t, ok := w.t.(pgx.ConnectTracer); ok {
		return t.TraceConnectStart(ctx, d)
	}
	return ctx
}

func (w withoutAcquire) TraceConnectEnd(ctx context.Context, d pgx.TraceConnectEndData) {
	if t, ok := w.t.(pgx.ConnectTracer); ok {
		t.TraceConnectEnd(ctx, d)
	}
}

func (w withoutAcquire) TraceRelease(p *pgxpool.Pool, d pgxpool.TraceReleaseData) {
	if t, ok := w.t.(pgxpool.ReleaseTracer); ok {
		t.TraceRelease(p, d)
	}
}
