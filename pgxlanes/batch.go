package pgxlanes

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// This file is where pgxlanes depends on pgx internals, both for batches that begin a
// transaction:
//   - pgx keeps the options of pgx.Batch.BeginTx unexported; batchKindOf learns whether they
//     are set from pgx.FailedBatchResults(b, nil).Tx(), which is non-nil exactly then.
//   - withQueriesAfterFirst copies a pgx.Batch by value, unexported fields included, to queue
//     queries of its own right after the BEGIN.
// Both are covered by tests that compare every exec mode with plain pgxpool
// (integration/batch_test.go), so a pgx release that changes them fails loudly.

// SendBatch sends b on a connection of the Short lane (or the lane ctx names), held until the
// BatchResults is closed. A batch that begins a transaction keeps its connection until that
// transaction ends, so it goes to the Tx lane unless ctx names a lane:
//   - begun with pgx.Batch.BeginTx, it gets the lane's timeouts and budget backstops as Begin
//     does, in the batch's own round trip. Behind a transaction pooler they are SET LOCAL
//     queries queued right after the BEGIN, whose results BatchResults hides (a tracer sees
//     them); b itself is not changed.
//   - begun by a "begin" queued by hand, it is treated like a held connection, since the batch
//     may end the transaction and go on.
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	kind := batchKindOf(b)
	def, ck := Short, kindStatement
	switch kind {
	case batchBeginTx:
		def, ck = Tx, kindTx
	case batchHandBegin:
		def, ck = Tx, kindHeld
	}
	l, err := p.acquire(ctx, def, ck, "")
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	hidden := 0
	if kind == batchBeginTx && p.pooler {
		set := &p.lanes[l.rt.set]
		sets := set.batchLocals
		if l.budget != set.cfg.Budget {
			sets = l.srv.sql.batchLocals(set.cfg, l.budget)
		}
		if len(sets) > 0 {
			b = withQueriesAfterFirst(b, sets)
			hidden = len(sets)
		}
	}
	gen := l.gen()
	if err := flushForExecBatch(ctx, l); err != nil {
		err = l.fail(err)
		l.release(gen)
		return pgx.FailedBatchResults(b, err)
	}
	br := &leaseBatch{br: l.conn.SendBatch(ctx, b), l: l, gen: gen, hidden: hidden}
	if tx := br.br.Tx(); tx != nil {
		br.tx = l.newTx(tx, true)
	} else {
		br.release = true
	}
	return br
}

// withQueriesAfterFirst returns a copy of b with sqls queued after its first query. The copy
// keeps b's unexported state (the options of Batch.BeginTx) and shares its queued queries and
// their callbacks; the new queries are new each time, since pgx writes into a queued query as it
// sends it.
func withQueriesAfterFirst(b *pgx.Batch, sqls []string) *pgx.Batch {
	nb := *b
	nb.QueuedQueries = make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+len(sqls))
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries[0])
	for _, sql := range sqls {
		nb.QueuedQueries = append(nb.QueuedQueries, &pgx.QueuedQuery{SQL: sql})
	}
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries[1:]...)
	return &nb
}

type batchKind uint8

const (
	batchPlain     batchKind = iota
	batchBeginTx             // pgx.Batch.BeginTx, whatever its BeginQuery
	batchHandBegin           // a first query that starts with BEGIN
)

func batchKindOf(b *pgx.Batch) batchKind {
	if b == nil || len(b.QueuedQueries) == 0 {
		return batchPlain
	}
	if pgx.FailedBatchResults(b, nil).Tx() != nil {
		return batchBeginTx
	}
	s := strings.TrimLeft(b.QueuedQueries[0].SQL, " \t\r\n")
	if len(s) >= 5 && strings.EqualFold(s[:5], "begin") {
		return batchHandBegin
	}
	return batchPlain
}
