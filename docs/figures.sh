#!/usr/bin/env bash
# Regenerates the figures quoted in README.md and docs/: runs each measuring test RUNS times (default
# 5) one after the other, and prints every figure as the median of the runs with its range, then the
# benchmarks (BENCHCOUNT runs, default 6) through benchstat. Run it on a quiet machine; the output
# says what the load was.
#
#   docs/figures.sh            # everything, about 50 minutes on 2 shared cores
#   RUNS=7 docs/figures.sh tests
#   docs/figures.sh bench
#   docs/figures.sh pool       # the pool's benchmarks alone (part of bench)
#   docs/figures.sh learner    # the learner's key benchmarks alone (part of bench)
#   DEMO_PLOT=docs/starvation.png docs/figures.sh demo
#   FIGURES_RAW=/tmp/raw docs/figures.sh all   # and keep the raw outputs
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
BENCHCOUNT=${BENCHCOUNT:-6}
# The paired benchmarks of client CPU and throughput report the median of their rounds, about 15
# in the default second: each runs for PAIREDTIME, so that a run's median is steady (about 150).
PAIREDTIME=${PAIREDTIME:-10s}
what=${1:-all}
# FIGURES_RAW=dir keeps every run's raw output there (the benchmarks' bench.txt, the demo's runs).
if [ -n "${FIGURES_RAW:-}" ]; then
	out=$FIGURES_RAW
	mkdir -p "$out"
else
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"

# median and range of the values of each "figure: <name> <value>" line, per name.
summarize() {
	grep -ho 'figure: [^ ]* [^ ]*' "$@" | awk '{print $2, $3}' | sort -k1,1 -k2,2g | awk '
		function flush() { if (n) { m = (n % 2) ? v[(n+1)/2] : (v[n/2] + v[n/2+1]) / 2;
			printf "%-42s median %10.4g   range %10.4g .. %-10.4g (%d runs)\n", name, m, v[1], v[n], n } }
		$1 != name { flush(); name = $1; n = 0 }
		{ v[++n] = $2 }
		END { flush() }'
}

if [ "$what" = all ] || [ "$what" = tests ]; then
	tests='TestHeadlineShortQueriesNotBlockedByTransactions|TestDeadlineReturnsOnTimeAndKeepsSessions|TestStaleCancelSoak|TestUnannotatedStormIsLearned|TestHeldConnectionCostsOneRoundTrip|TestStdlibHeadline|TestPgBouncerHeadline|TestRetryJitterVersusFixed'
	# Without -race: the race detector slows every call several times over and would distort
	# latencies and ratios (make test runs these tests with -race for correctness).
	(cd integration && go test -c -o "$out/integration.test" . >/dev/null)
	for i in $(seq "$RUNS"); do
		echo "run $i of $RUNS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
		# TestRetryJitterVersusFixed runs its modes once per run here: the runs give the medians.
		(cd integration && PGXLANES_RETRY_ROUNDS=1 "$out/integration.test" -test.run "^($tests)\$" -test.v -test.count=1 >"$out/run$i.log" 2>&1) ||
			{ echo "run $i failed:"; grep -E -- '--- FAIL|Error:|_test.go' "$out/run$i.log" | head -20; }
	done
	echo
	echo "== figures (from integration tests, built without -race, $RUNS runs)"
	summarize "$out"/run*.log
fi

# demo_figures FILE: the ratios and targets of one demo run as "figure: <name> <value>" lines.
demo_figures() {
	awk '
		/^ratios/ { sect = "ratio"; next }
		/^targets/ || /^verdict: each/ { sect = "target"; next }
		/^$/ { sect = ""; next }
		sect == "ratio" && match($0, /[0-9.]+×/) {
			name = substr($0, 1, RSTART - 1); v = substr($0, RSTART, RLENGTH - 2)
			gsub(/^ +| +$/, "", name); gsub(/ \/ /, "_over_", name); gsub(/[ ,]+/, "_", name); print "figure: demo.ratio." name " " v
		}
		sect == "target" && /want/ {
			name = substr($0, 3, 44); split(substr($0, 47), rest, " "); v = rest[1]; sub(/×$/, "", v)
			gsub(/^ +| +$/, "", name); gsub(/ \/ /, "_over_", name); gsub(/[ ,:]+/, "_", name)
			if (v ~ /^[0-9.]+$/) print "figure: demo.target." name " " v
		}' "$1"
}

if [ "$what" = all ] || [ "$what" = demo ]; then
	echo
	echo "== the starvation demo, full size ($RUNS runs, one after the other)"
	(cd examples && go build -o "$out/starvation" ./starvation)
	for i in $(seq "$RUNS"); do
		echo "demo run $i of $RUNS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
		"$out/starvation" -quiet -plot "$out/demo$i.png" -json "$out/demo$i.json" >"$out/demo$i.txt" 2>&1 ||
			echo "demo run $i exited non-zero (a failed verdict, or a failure): see below"
		demo_figures "$out/demo$i.txt" >"$out/demo$i.fig"
	done
	summarize "$out"/demo*.fig
	echo
	echo "-- the last run in full (its picture: ${DEMO_PLOT:-not kept; set DEMO_PLOT=docs/starvation.png})"
	cat "$out/demo$RUNS.txt"
	if [ -n "${DEMO_PLOT:-}" ]; then cp "$out/demo$RUNS.png" "$DEMO_PLOT"; fi
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = pool ]; then
	echo
	echo "== benchmarks ($BENCHCOUNT runs each; ratios by benchstat -col /Impl; the paired ones for $PAIREDTIME each)"
	(cd integration && go test -run '^$' -bench 'Select1|AcquireRelease|BenchmarkTx$|HotPath(AcquireRelease|ClientCPU$|Throughput$|WaiterHeap|ConnHeap)' -benchmem -count "$BENCHCOUNT" . &&
		go test -run '^$' -bench 'HotPath(ClientCPU|Throughput)Paired' -benchmem -count "$BENCHCOUNT" -benchtime "$PAIREDTIME" . &&
		go test -run '^$' -bench 'OverLink' -benchmem -count "$BENCHCOUNT" -benchtime 300x . &&
		go test -run '^$' -bench 'Deadline' -count "$BENCHCOUNT" -benchtime 100x . &&
		cd .. && go test -run '^$' -bench 'AcquireRelease|Contended' -benchmem -count "$BENCHCOUNT" ./reserve) >"$out/bench.txt" 2>&1 || true
	go run golang.org/x/perf/cmd/benchstat@latest -col /Impl "$out/bench.txt" || cat "$out/bench.txt"
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = learner ]; then
	echo
	echo "== the learner's key: folded against a plain hash ($BENCHCOUNT runs each)"
	# One run of every benchmark per round, BENCHCOUNT rounds: the contenders interleaved, so
	# that the VM's drift over minutes falls on both (-count would run each one's runs in a row).
	(cd internal/stmtstats && go test -c -o "$out/stmtstats.test" . &&
		for i in $(seq "$BENCHCOUNT"); do
			"$out/stmtstats.test" -test.run '^$' -test.bench 'BenchmarkKey|LearnerPerCall|FoldHash|ClassifyObserve/Statements=.*/Goroutines=1/' -test.benchmem -test.count 1
		done) >"$out/fold.txt" 2>&1 || true
	go run golang.org/x/perf/cmd/benchstat@latest -filter '.name:Key' -col /Hash "$out/fold.txt" || cat "$out/fold.txt"
	go run golang.org/x/perf/cmd/benchstat@latest -filter '.name:LearnerPerCall' -col /Key "$out/fold.txt" || true
	go run golang.org/x/perf/cmd/benchstat@latest -filter '.name:FoldHash' -col /Impl "$out/fold.txt" || true
	echo "(the learner's whole step, Key + Arrive + Done, with 1 and 1,024 constant statements; HashOnly is a plain hash alone)"
	go run golang.org/x/perf/cmd/benchstat@latest -filter '.name:ClassifyObserve' -col /Work "$out/fold.txt" || true
fi
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
