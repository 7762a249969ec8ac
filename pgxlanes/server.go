package pgxlanes

import (
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// server is a PostgreSQL server the pool's lanes use: the primary, where every lane is unless
// LaneConfig.Server aims Long elsewhere (a read replica), and that other server. Each has its
// pgxpool, the admission of the lanes on it (a lane borrows only connections of its own server),
// its guard session, its lock-holder registry and its counts.
type server struct {
	pool    *pgxpool.Pool
	res     *reserve.Pool
	term    *terminator
	holders holders
	// live is the sweep's table: the published leases by their slot's index (sweep.go).
	live    []liveEntry
	sql     sessionSQL // against the values RESET restores, read at the first connect
	learner sessionLearner
	// connectTimeout bounds the opening of a connection (ConnConfig.ConnectTimeout of its pgxpool).
	connectTimeout time.Duration

	// open counts pgxpool's connections (AfterConnect to BeforeClose or hijack) and leased those
	// handed to leases; open > leased means a connection is idle, so pgxpool will not dial.
	open   atomic.Int64
	leased atomic.Int64
	// lastUse is when the most recently ended lease had been acquired (a mono reading, to within
	// a millisecond; 0 before any lease ended): if it is old, or none ended yet, the idle
	// connection pgxpool hands out next may be pinged first.
	lastUse atomic.Int64

	// parks: leases park their connections here between them (park.go); lifetime is pgxpool's
	// MaxConnLifetime (0: none), past which a connection is not parked.
	parks    atomic.Bool // false once a PgxpoolView is taken (compat.go)
	park     parking
	lifetime time.Duration
}

// lanesOn returns the lanes on the primary, and those aimed at another server.
func (c *Config) lanesOn() (primary, remote []Lane) {
	for _, l := range Lanes() {
		if c.Lane(l).Server != nil {
			remote = append(remote, l)
		} else {
			primary = append(primary, l)
		}
	}
	return primary, remote
}
