#!/usr/bin/env bash
# Counts what the client process does per call, pgxpool beside pgxlanes: system calls, context
# switches, user and system CPU time (perf stat; Debian's linux-perf). Each figure is the
# difference between a run of 300,000 calls and one of 100,000 (BenchmarkHotPathClientCPU, 8
# clients on 8 connections), so the process's setup cancels; the two pools alternate, ROUNDS
# rounds (default 5).
#
# The server must be one the harness does not start, or perf would count its processes too:
#
#   PGXLANES_TEST_DATABASE=postgres://postgres@127.0.0.1:5432/postgres docs/syscalls.sh
#   KIND=Exec ROUNDS=7 docs/syscalls.sh
set -euo pipefail
cd "$(dirname "$0")/../integration"
: "${PGXLANES_TEST_DATABASE:?set it to a server of your own (see above)}"
command -v perf >/dev/null || { echo "syscalls.sh: perf is missing (apt-get install linux-perf)" >&2; exit 1; }
KIND=${KIND:-QueryRow}
ROUNDS=${ROUNDS:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go test -c -o "$out/integration.test" .

# one IMPL N prints the calls' system calls, context switches, user and system seconds.
one() {
	perf stat -e raw_syscalls:sys_enter,context-switches -o "$out/stat.txt" -- \
		"$out/integration.test" -test.run '^$' -test.bench "^BenchmarkHotPathClientCPU\$/Kind=$KIND/Impl=$1\$" \
		-test.benchtime "${2}x" >"$out/bench.txt" 2>&1
	awk '/raw_syscalls/ {gsub(",", "", $1); s = $1} /context-switches/ {gsub(",", "", $1); c = $1}
		/seconds user/ {u = $1} /seconds sys/ {y = $1} END {print s, c, u, y}' "$out/stat.txt"
}

echo "machine: $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg); $KIND, per call"
for r in $(seq "$ROUNDS"); do
	for impl in pgxpool pgxlanes; do
		echo "$r $impl $(one "$impl" 100000) $(one "$impl" 300000)" | awk '{n = 200000
			printf "round %s %-8s syscalls %.3f  context switches %.3f  user %.2f µs  sys %.2f µs\n",
				$1, $2, ($7-$3)/n, ($8-$4)/n, ($9-$5)*1e6/n, ($10-$6)*1e6/n}'
	done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
