package main

import (
	"math"
	"slices"
	"sync"
	"time"
)

// phase is a part of a contender's run. phaseLong marks the long transactions' calls and
// phaseSlowStmt the unannotated slow statements' calls; phaseCritical, phaseBgShort and phaseBgTx
// the priority phase's critical requests and its background work in Short and in Tx (priority.go).
type phase uint8

const (
	phaseSteady phase = iota
	phaseTransition
	phaseBurst
	phaseLearn // the slow statements start; the learning period
	phaseSlow  // the slow statements go on: measured
	phaseLong
	phaseSlowStmt
	phaseCritical
	phaseBgShort
	phaseBgTx

	numPhases    = 5 // the phases of the short traffic
	numAllPhases = 10
)

var phaseNames = [numAllPhases]string{"steady", "transition", "burst", "learn", "slow", "long", "slowstmt",
	"critical", "background-short", "background-tx"}

func (p phase) String() string { return phaseNames[p] }

// phaseOfTag maps a pgxlanes tag back to the phase it was set for.
func phaseOfTag(tag string) (phase, bool) {
	for i, n := range phaseNames {
		if n == tag {
			return phase(i), true
		}
	}
	return 0, false
}

// errKind sorts the outcome of a call.
type errKind uint8

const (
	kindOK errKind = iota
	kindAcquireTimeout
	kindLaneFull
	kindDeadline
	kindOther
	numKinds
)

var kindNames = [numKinds]string{"ok", "acquire_timeout", "lane_full", "deadline", "other"}

// sample is one short lookup.
type sample struct {
	at   time.Duration // scheduled time, from the contender's start
	lat  time.Duration // from the scheduled time to the end of the call
	ph   phase
	kind errKind
}

// probeSample is one run of the machine probe.
type probeSample struct {
	at  time.Duration // when it was due, from the contender's start
	lat time.Duration // from then to the end of its round trip
}

// slowRun is one unannotated slow statement that ended, completed or failed.
type slowRun struct {
	end  time.Duration // from the contender's start
	lat  time.Duration // from the call to its end
	kind errKind
}

type phaseInfo struct {
	set  bool
	from time.Duration
	dur  time.Duration
	rate float64
	work time.Duration
}

// recorder collects one contender's figures. It is safe for concurrent use; start is set before
// any goroutine uses it.
type recorder struct {
	start time.Time

	mu sync.Mutex
	// Guarded by mu:
	cur      phase
	phases   [numPhases]phaseInfo
	sent     int
	shorts   []sample
	acquires [numAllPhases][]time.Duration // successful acquire waits, by phase (then phaseLong, phaseSlowStmt ...)
	longs    []time.Duration               // commit times of long transactions, from start
	holds    []time.Duration               // how long each committed transaction held its row lock
	probes   []probeSample                 // the machine probe (probe.go)
	longFail [numKinds]int
	slows    []slowRun         // the slow statements that ended
	slowCut  int               // slow statements withdrawn, still waiting, at the end of the slow phase
	bg       [2]bgCount        // the priority phase's background work, in Short and in Tx (priority.go)
	examples map[string]string // one error message per kind, for the report
	seen     int               // shorts already reported by progress
}

func newRecorder() *recorder { return &recorder{examples: map[string]string{}} }

func (r *recorder) setPhase(ph phase, from time.Time, dur time.Duration, rate float64, work time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur = ph
	r.phases[ph] = phaseInfo{set: true, from: from.Sub(r.start), dur: dur, rate: rate, work: work}
}

func (r *recorder) short(ph phase, at time.Time, lat time.Duration, kind errKind, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shorts = append(r.shorts, sample{at: at.Sub(r.start), lat: lat, ph: ph, kind: kind})
	r.example("lookup", kind, err)
}

func (r *recorder) issued() {
	r.mu.Lock()
	r.sent++
	r.mu.Unlock()
}

func (r *recorder) acquired(ph phase, wait time.Duration) {
	r.mu.Lock()
	r.acquires[ph] = append(r.acquires[ph], wait)
	r.mu.Unlock()
}

// longCommitted records a commit at t of a transaction that held its row for held (0: not
// counted in the hold times, as a worker's first transaction, a part of a hold).
func (r *recorder) longCommitted(t time.Time, held time.Duration) {
	r.mu.Lock()
	r.longs = append(r.longs, t.Sub(r.start))
	if held > 0 {
		r.holds = append(r.holds, held)
	}
	r.mu.Unlock()
}

func (r *recorder) probed(due time.Time, lat time.Duration) {
	r.mu.Lock()
	r.probes = append(r.probes, probeSample{at: due.Sub(r.start), lat: lat})
	r.mu.Unlock()
}

func (r *recorder) longFailed(kind errKind, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.longFail[kind]++
	r.example("long", kind, err)
}

// slowEnded records a slow statement that completed or failed, started at t0.
func (r *recorder) slowEnded(t0 time.Time, kind errKind, err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slows = append(r.slows, slowRun{end: now.Sub(r.start), lat: now.Sub(t0), kind: kind})
	r.example("slow", kind, err)
}

func (r *recorder) slowWithdrawn() {
	r.mu.Lock()
	r.slowCut++
	r.mu.Unlock()
}

// example keeps the first error message of each kind. Caller must hold mu.
func (r *recorder) example(what string, kind errKind, err error) {
	if err == nil {
		return
	}
	key := what + " " + kindNames[kind]
	if _, ok := r.examples[key]; !ok {
		r.examples[key] = err.Error()
	}
}

type progressLine struct {
	phase              string
	sent, done, failed int
	recent             int // lookups finished since the last call
	recentP99          time.Duration
	long, slow         int
}

// progress returns the counts so far and the p99 of the lookups finished since the last call.
func (r *recorder) progress() progressLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := progressLine{phase: r.cur.String(), sent: r.sent, long: len(r.longs)}
	for _, s := range r.slows {
		if s.kind == kindOK {
			p.slow++
		}
	}
	var recent []time.Duration
	for i, s := range r.shorts {
		if s.kind == kindOK {
			p.done++
		} else {
			p.failed++
		}
		if i >= r.seen {
			recent = append(recent, s.lat)
		}
	}
	r.seen = len(r.shorts)
	p.recent = len(recent)
	if len(recent) > 0 {
		slices.Sort(recent)
		p.recentP99 = recent[rank(len(recent), 0.99)]
	}
	return p
}

// rank is the nearest-rank index of quantile q among n ordered values.
func rank(n int, q float64) int {
	return min(max(int(math.Ceil(q*float64(n)))-1, 0), n-1)
}

// result summarizes the run. Lookups that failed rank above every successful one: a percentile
// that falls on a failure is reported as null ("failed"), never as a fast figure.
func (r *recorder) result(name, about string, load bool, elapsed time.Duration) *contenderResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &contenderResult{Name: name, About: about, Load: load, Seconds: round3(elapsed.Seconds()),
		Errors: r.examples}
	for ph := range phase(numPhases) {
		if r.phases[ph].set {
			*res.phase(ph) = r.phaseResult(true, ph)
		}
	}
	if r.phases[phaseLearn].set && r.phases[phaseSlow].set {
		// The slow phase as the table and the verdict judge it: from the first slow statement,
		// the learning window included.
		res.SlowWhole = r.phaseResult(false, phaseLearn, phaseSlow)
	}
	if len(r.slows) > 0 || r.slowCut > 0 {
		res.SlowStmts = r.slowResult()
	}
	res.Long.Committed = len(r.longs)
	if len(r.longs) > 0 {
		// Over the time the transactions ran: until the learning period, when they are cut short.
		span := elapsed
		if info := r.phases[phaseLearn]; info.set {
			span = info.from
		}
		res.Long.PerSecond = round3(float64(len(r.longs)) / span.Seconds())
	}
	for k := kindAcquireTimeout; k < numKinds; k++ {
		for range r.longFail[k] {
			res.Long.Failed.add(k)
		}
	}
	res.Long.AcquireWait = waitQuantiles(r.acquires[phaseLong])
	if len(r.holds) > 0 {
		h := slices.Clone(r.holds)
		slices.Sort(h)
		res.Long.HoldP50MS = ms(h[len(h)/2])
	}
	return res
}

// phaseResult summarizes the consecutive phases phs as one, with the samples of each lookup if
// samples. Caller must hold mu.
func (r *recorder) phaseResult(samples bool, phs ...phase) *phaseResult {
	first, last := r.phases[phs[0]], r.phases[phs[len(phs)-1]]
	from, dur := first.from, last.from+last.dur-first.from
	pr := &phaseResult{Seconds: dur.Seconds(), Rate: last.rate, WorkMS: ms(last.work), FromS: round3(from.Seconds())}
	var ok, waits []time.Duration
	for _, s := range r.shorts {
		if !slices.Contains(phs, s.ph) {
			continue
		}
		pr.Issued++
		pr.Failed.add(s.kind)
		if s.kind == kindOK {
			ok = append(ok, s.lat)
			if samples {
				pr.Samples.AtMS = append(pr.Samples.AtMS, ms(s.at))
				pr.Samples.LatencyMS = append(pr.Samples.LatencyMS, ms(s.lat))
			}
		} else if samples {
			pr.FailedAtMS = append(pr.FailedAtMS, ms(s.at))
		}
	}
	for _, ph := range phs {
		waits = append(waits, r.acquires[ph]...)
	}
	pr.OK = len(ok)
	slices.Sort(ok)
	pr.Latency = latencyQuantiles(ok, pr.Issued)
	pr.AcquireWait = waitQuantiles(waits)
	in := func(t time.Duration) bool { return t >= from && t < from+dur }
	for _, c := range r.longs {
		if in(c) {
			pr.LongCommitted++
		}
	}
	var probes []time.Duration
	for _, p := range r.probes {
		if in(p.at) {
			probes = append(probes, p.lat)
		}
	}
	pr.Probe = waitQuantiles(probes)
	for _, s := range r.slows {
		switch {
		case !in(s.end):
		case s.kind == kindOK:
			pr.SlowDone++
		default:
			pr.SlowFailed++
		}
	}
	return pr
}

// slowResult summarizes the slow statements. Caller must hold mu.
func (r *recorder) slowResult() *slowResult {
	sr := &slowResult{Withdrawn: r.slowCut, AcquireWait: waitQuantiles(r.acquires[phaseSlowStmt])}
	var ok []time.Duration
	for _, s := range r.slows {
		if s.kind == kindOK {
			ok = append(ok, s.lat)
		} else {
			sr.Failed.add(s.kind)
		}
	}
	sr.Completed = len(ok)
	slices.Sort(ok)
	sr.Latency = latencyQuantiles(ok, len(ok))
	return sr
}

func latencyQuantiles(sortedOK []time.Duration, total int) quantiles {
	var q quantiles
	if total == 0 {
		return q
	}
	at := func(p float64) *float64 {
		i := rank(total, p)
		if i >= len(sortedOK) {
			return nil
		}
		v := ms(sortedOK[i])
		return &v
	}
	q.P50, q.P99, q.P999 = at(0.50), at(0.99), at(0.999)
	if len(sortedOK) == total {
		v := ms(sortedOK[total-1])
		q.Max = &v
	}
	return q
}

func waitQuantiles(waits []time.Duration) waitStats {
	if len(waits) == 0 {
		return waitStats{}
	}
	w := slices.Clone(waits)
	slices.Sort(w)
	return waitStats{N: len(w), P99MS: ms(w[rank(len(w), 0.99)]), MaxMS: ms(w[len(w)-1])}
}

// ms converts d to milliseconds, rounded to the microsecond.
func ms(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }
