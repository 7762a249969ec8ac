package wire

import (
	"sync/atomic"
	"time"
)

// Finish is a pool's end of one use of the Conn, in one lock instead of five (OnClean,
// ClearInterrupt, Broken, Failed, Stage): if a drain is under way it arranges for f.Cleaned as
// OnClean does, and returns draining; otherwise it drops a pending interrupt as ClearInterrupt
// does, stages the defaults as Stage("") does, and reports whether the Conn is fit for another
// use (neither broken nor with a failed staged setting). If it returns draining, it has added 1
// to *cleaning (when not nil) before queueing f, under the Conn's lock: f.Cleaned, which runs
// after, may take it back without the count ever going below zero.
func (c *Conn) Finish(f Cleaner, cleaning *atomic.Int64) (draining, fit bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st == stateDraining {
		if cleaning != nil {
			cleaning.Add(1)
		}
		c.onClean = append(c.onClean, f)
		return true, false
	}
	if c.intr != nil {
		c.intr = nil
		if c.st == stateReady || c.st == stateStartup {
			_ = c.Conn.SetDeadline(time.Time{})
		}
	}
	c.staged = ""
	return false, c.st != stateBroken && !c.failed
}
