package reserve

import (
	"fmt"
	"math"
	"time"
)

// LaneConfig configures one lane.
type LaneConfig struct {
	// Name identifies the lane in errors and Stat. It must be unique and not empty.
	Name string
	// Reserved is the number of slots that no other lane's unbounded work may take.
	Reserved int
	// MaxConns caps the slots the lane holds at once. 0 means no cap of its own: the lane may
	// hold as many as it can reach (see Config.Reachable).
	MaxConns int
	// MaxWaiters bounds the lane's wait queue. A caller that would exceed it fails at once with
	// ErrLaneFull. 0 means unlimited.
	MaxWaiters int
	// Bounded says the lane's holders release within a known time. Only bounded lanes may
	// borrow beyond their reserve and the shared slots.
	Bounded bool
	// AcquireTimeout bounds how long a caller waits for a slot. 0 means it waits until its ctx
	// ends.
	AcquireTimeout time.Duration
	// PriorityAge turns on priorities (Caller.Priority): higher first, FIFO among equals, and a
	// waiter that has waited PriorityAge is served before every later arrival. 0 means FIFO,
	// priorities ignored.
	PriorityAge time.Duration
	// MaxTagShare is the most slots of the lane one tag (Caller.Tag) may hold while a waiter of
	// a tag holding fewer waits. 0 means no limit. With TagShareDryRun the limit is only counted
	// (LaneStat.TagShareRefusals, Slot.HeldBack), never applied.
	MaxTagShare    int
	TagShareDryRun bool
	// PriorityHeadroom keeps the lane's last slots for callers of priority 0 or more: a caller
	// of negative priority (background work) is granted a slot only while the lane could take
	// more than PriorityHeadroom slots after it, so that work of a higher priority arriving
	// under a saturating background load finds a slot at once instead of waiting for a release.
	// It needs PriorityAge, and is less than the lane's cap (Reachable). 0 means none.
	PriorityHeadroom int
}

// Config configures a Pool.
type Config struct {
	// Size is the total number of slots, from 1 to math.MaxInt32.
	Size int
	// Lanes are the lanes; Acquire refers to a lane by its index in this slice.
	Lanes []LaneConfig
}

// shared returns the slots that no lane reserves.
func (c Config) shared() int {
	n := c.Size
	for _, l := range c.Lanes {
		n -= l.Reserved
	}
	return n
}

// Reachable returns the most slots lane i can ever hold: min(MaxConns, Size) for a bounded
// lane, min(MaxConns, Reserved+Shared) for an unbounded one, where Shared is Size minus every
// lane's reserve and MaxConns 0 means no cap. It is the lane's effective MaxConns.
func (c Config) Reachable(i int) int {
	l := c.Lanes[i]
	n := c.Size
	if !l.Bounded {
		n = min(n, l.Reserved+c.shared())
	}
	if l.MaxConns > 0 {
		n = min(n, l.MaxConns)
	}
	return max(n, 0)
}

// ConfigError is the error returned by Validate and New. Field is one of Size, Name, Reserved,
// MaxConns, MaxWaiters, AcquireTimeout, PriorityAge, MaxTagShare and PriorityHeadroom; Lane is the lane's name, or "" for Size and for a
// lane without a name. Reason completes a sentence that starts with the field's name, as
// Error shows.
type ConfigError struct {
	Lane   string
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Lane == "" {
		return fmt.Sprintf("reserve: %s %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("reserve: lane %q: %s %s", e.Lane, e.Field, e.Reason)
}

// Validate reports the first rule c breaks as a *ConfigError, or nil. The rules:
//
//   - Size is at least 1 and at most math.MaxInt32; there is at least one lane, and fewer than
//     1<<24;
//   - every lane has a unique, non-empty Name;
//   - no number or duration is negative (PriorityAge, MaxTagShare and PriorityHeadroom
//     included);
//   - PriorityHeadroom needs PriorityAge and is less than what the lane can reach;
//   - a lane's MaxConns, when set, is at most Size and at least its Reserved;
//   - the reserves sum to at most Size;
//   - an unbounded lane's MaxConns, when set, is at most what it can reach (Reachable), and the
//     lane can reach at least one slot.
func Validate(c Config) error {
	bad := func(lane, field, format string, args ...any) error {
		return &ConfigError{Lane: lane, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Size < 1:
		return bad("", "Size", "%d must be at least 1", c.Size)
	case c.Size > math.MaxInt32:
		return bad("", "Size", "%d exceeds %d", c.Size, math.MaxInt32)
	case len(c.Lanes) == 0:
		return bad("", "Name", "of lane 0 missing: a pool needs at least one lane")
	case len(c.Lanes) > laneMask:
		return bad("", "Name", "of lane %d: a pool has at most %d lanes", laneMask, laneMask)
	}
	reserved := 0
	for i, l := range c.Lanes {
		if l.Name == "" {
			return bad("", "Name", "of lane %d is empty", i)
		}
		for j := range i {
			if c.Lanes[j].Name == l.Name {
				return bad(l.Name, "Name", "is used by lanes %d and %d", j, i)
			}
		}
		switch {
		case l.Reserved < 0:
			return bad(l.Name, "Reserved", "%d is negative", l.Reserved)
		case l.MaxConns < 0:
			return bad(l.Name, "MaxConns", "%d is negative", l.MaxConns)
		case l.MaxWaiters < 0:
			return bad(l.Name, "MaxWaiters", "%d is negative", l.MaxWaiters)
		case l.AcquireTimeout < 0:
			return bad(l.Name, "AcquireTimeout", "%v is negative", l.AcquireTimeout)
		case l.PriorityAge < 0:
			return bad(l.Name, "PriorityAge", "%v is negative", l.PriorityAge)
		case l.MaxTagShare < 0:
			return bad(l.Name, "MaxTagShare", "%d is negative", l.MaxTagShare)
		case l.PriorityHeadroom < 0:
			return bad(l.Name, "PriorityHeadroom", "%d is negative", l.PriorityHeadroom)
		case l.PriorityHeadroom > 0 && l.PriorityAge == 0:
			return bad(l.Name, "PriorityHeadroom", "needs PriorityAge: without it the lane is FIFO and ignores priorities")
		case l.MaxConns > c.Size:
			return bad(l.Name, "MaxConns", "%d exceeds Size %d", l.MaxConns, c.Size)
		case l.MaxConns > 0 && l.Reserved > l.MaxConns:
			return bad(l.Name, "Reserved", "%d exceeds MaxConns %d", l.Reserved, l.MaxConns)
		}
		if l.Reserved > c.Size-reserved {
			return bad(l.Name, "Reserved", "%d exceeds the %d slots of Size %d that the lanes before it leave unreserved",
				l.Reserved, c.Size-reserved, c.Size)
		}
		reserved += l.Reserved
	}
	shared := c.Size - reserved
	for i, l := range c.Lanes {
		if reach := c.Reachable(i); l.PriorityHeadroom > 0 && l.PriorityHeadroom >= reach {
			return bad(l.Name, "PriorityHeadroom", "%d leaves callers of negative priority none of the lane's %d slots", l.PriorityHeadroom, reach)
		}
		if l.Bounded {
			continue
		}
		reach := c.Reachable(i)
		switch {
		case l.MaxConns > reach:
			return bad(l.Name, "MaxConns", "%d exceeds the %d slots the lane can reach (its reserve %d + %d shared)",
				l.MaxConns, reach, l.Reserved, shared)
		case reach == 0:
			return bad(l.Name, "Reserved", "0 leaves the unbounded lane no slot: the reserves take all %d slots", c.Size)
		}
	}
	return nil
}
