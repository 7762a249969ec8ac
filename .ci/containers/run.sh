#!/usr/bin/env bash
# run.sh: `make test-containers`. Runs the test harness's Docker path end to end on this machine,
# on a Docker engine of its own that makes no traffic beyond 127.0.0.1 and pulls nothing:
#
#  1. provision: install Debian's docker.io if dockerd is missing (services kept from starting);
#     start a private dockerd (vfs storage, no iptables, no default bridge, no IP forwarding, a
#     socket and data root under $PGXLANES_DOCKER_DIR); build a PostgreSQL image from the local
#     binaries with build-image.sh unless it is there already;
#  2. test, with the Docker step forced and on the host's network (PostgreSQL on 127.0.0.1 only),
#     the part of the suite that depends on where the server comes from: the Docker step's own
#     tests (pgxlanestest/containers), the harness's tests of a server from any source
#     (internal/pgserver: it answers, isolated databases, drop, the DSN's password), and the tests
#     of pgxlanestest (both through a workspace and an overlay that link the Docker step into
#     them); every harness start must say it used Docker. The integration suite is not run again
#     here: it runs in `make test` against the local server, and what it tests (the pool) does not
#     depend on where the server runs; the harness's and pgxlanestest's tests cover what does;
#  3. tear down: containers, networks, dockerd; then check with ps that nothing it started is left.
#
# Exit status: 0 when the tests passed on the Docker path, 3 when provisioning failed (after a
# banner that says why), 1 when a test or the teardown failed. If PGXLANES_CONTAINERS_STATUS names
# a file, the outcome is written there too ("ok", "provision: REASON", "tests: WHAT",
# "teardown: WHAT"), so that .ci/run can tell a machine that cannot run Docker from a failure.
set -uo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo" || exit 1

dir="${PGXLANES_DOCKER_DIR:-/var/tmp/pgxlanes-docker}"
sock="$dir/docker.sock"
status_file="${PGXLANES_CONTAINERS_STATUS:-}"
image_repo="pgxlanes-local/postgres"
logs="$(mktemp -d /tmp/pgxlanes-containers.XXXXXX)"

dockerd_pid=""
timings=()

say() { printf '\n== test-containers: %s\n' "$*"; }
set_status() { if [ -n "$status_file" ]; then printf '%s\n' "$*" >"$status_file"; fi; }
now() { printf '%s' "$EPOCHREALTIME"; }
# elapsed START: seconds since START, to one decimal.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
dockercli() { docker -H "unix://$sock" "$@"; }

# provision_failed REASON...: the machine cannot run the Docker path. Loud, and exit 3.
provision_failed() {
	local reason="$*"
	set_status "provision: $reason"
	{
		echo
		echo '################################################################################'
		echo '##  make test-containers: PROVISIONING FAILED, the Docker path was NOT tested'
		echo "##  reason: $reason"
		echo '################################################################################'
	} >&2
	teardown || true
	exit 3
}

# stop_dockerd: stops the dockerd this run started, by its PID, and waits for it and the
# containerd it manages.
stop_dockerd() {
	[ -n "$dockerd_pid" ] || return 0
	if kill -0 "$dockerd_pid" 2>/dev/null; then
		kill -TERM "$dockerd_pid"
		for _ in $(seq 1 300); do
			kill -0 "$dockerd_pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$dockerd_pid" 2>/dev/null; then
			echo "test-containers: dockerd ($dockerd_pid) did not stop in 30s: SIGKILL" >&2
			kill -KILL "$dockerd_pid" 2>/dev/null
		fi
	fi
	wait "$dockerd_pid" 2>/dev/null
	dockerd_pid=""
}

# teardown: removes every container and network of the private engine, stops it, and checks
# that no process of it is left. Safe to call twice.
teardown() {
	local ok=0
	if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
		local ids
		ids="$(dockercli ps -aq)"
		if [ -n "$ids" ]; then
			# Every server the tests start must be closed by them: a container left is a failure.
			echo "test-containers: containers left behind by the tests, removing them: ${ids//$'\n'/ }" >&2
			# shellcheck disable=SC2086
			dockercli rm -f $ids >/dev/null
			ok=1
		fi
		# testcontainers makes a bridge network (reaper_default) when the engine has none; the
		# containers ran on the host's network, so it must have carried no packet.
		local nid name driver
		for nid in $(dockercli network ls -q --filter type=custom); do
			name="$(dockercli network inspect -f '{{.Name}}' "$nid")"
			driver="$(dockercli network inspect -f '{{.Driver}}' "$nid")"
			if [ "$driver" = bridge ] && [ -d "/sys/class/net/br-${nid:0:12}" ]; then
				echo "test-containers: network $name (br-${nid:0:12}): $(cat "/sys/class/net/br-${nid:0:12}/statistics/tx_packets") packets sent, $(cat "/sys/class/net/br-${nid:0:12}/statistics/rx_packets") received; removing it"
			else
				echo "test-containers: removing network $name ($driver)"
			fi
			dockercli network rm "$nid" >/dev/null || ok=1
		done
	fi
	stop_dockerd
	rm -f "$sock"
	# dockerd leaves its network namespace mounted under the exec root.
	local m
	for m in $(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
		umount "$m" || ok=1
	done
	# Everything the engine ran carries $dir in its command line: dockerd, containerd, the shims.
	local left
	left="$(ps -eo pid=,args= | grep -F -- "$dir/" | grep -v -F -- "grep -F" || true)"
	if [ -n "$left" ]; then
		echo "test-containers: processes of the private Docker engine are still running:" >&2
		echo "$left" >&2
		ok=1
	fi
	return "$ok"
}
trap 'teardown >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM

# --- provision ---------------------------------------------------------------------------------

say "provision"
mkdir -p "$dir" || provision_failed "cannot make $dir"
# One run at a time per machine: the engine, its socket and its data root are shared. Processes
# that may outlive a killed run (dockerd, go test) do not inherit the lock's descriptor.
exec 9>"$dir/lock"
if ! flock -w 900 9; then
	provision_failed "another make test-containers has held $dir/lock for 15 minutes"
fi

t="$(now)"
if command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1; then
	timings+=("install: none (dockerd $(dockerd --version 2>/dev/null | awk '{ print $3 }' | tr -d ,) is installed)")
else
	if [ "$(id -u)" -ne 0 ]; then
		provision_failed "dockerd is not installed, and installing Debian's docker.io needs root"
	fi
	command -v apt-get >/dev/null 2>&1 || provision_failed "dockerd is not installed, and there is no apt-get to install docker.io"
	echo "installing docker.io (Debian) ..."
	export DEBIAN_FRONTEND=noninteractive
	# policy-rc.d exit 101 keeps the packages from starting their services: the run starts its
	# own dockerd on a socket of its own.
	policy=/usr/sbin/policy-rc.d
	made_policy=0
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
	fi
	apt-get update -q >"$logs/apt.log" 2>&1 &&
		apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 docker.io >>"$logs/apt.log" 2>&1
	rc=$?
	if [ "$made_policy" -eq 1 ]; then rm -f "$policy"; fi
	if [ "$rc" -ne 0 ]; then
		tail -n 20 "$logs/apt.log" >&2
		provision_failed "apt-get install docker.io failed (exit $rc)"
	fi
	# Nor at the next boot: a system Docker engine would make `make test` use it, and pull.
	rm -f /etc/systemd/system/multi-user.target.wants/docker.service \
		/etc/systemd/system/sockets.target.wants/docker.socket \
		/etc/systemd/system/multi-user.target.wants/containerd.service
	if command -v update-rc.d >/dev/null 2>&1; then update-rc.d docker disable >/dev/null 2>&1 || true; fi
	timings+=("install: $(elapsed "$t")s (docker.io $(dpkg-query -W -f '${Version}' docker.io))")
fi

# A dockerd left by an earlier run that was killed: it is this script's, found by its pidfile
# and the data root in its command line.
if [ -f "$dir/dockerd.pid" ]; then
	old="$(cat "$dir/dockerd.pid")"
	if [ -n "$old" ] && ps -o args= -p "$old" 2>/dev/null | grep -q -F -- "--data-root $dir/data"; then
		echo "stopping the dockerd ($old) an earlier run left behind"
		kill -TERM "$old"
		for _ in $(seq 1 300); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
	fi
	rm -f "$dir/dockerd.pid"
fi

t="$(now)"
rm -f "$sock"
# No iptables, no bridge, no forwarding, no port proxies: containers run on the host's network
# only. Registry access goes to a closed port on 127.0.0.1, so a missing image fails at once
# instead of reaching out. Own containerd namespaces, in case dockerd finds a system containerd.
HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY='' \
	dockerd \
	--host "unix://$sock" \
	--data-root "$dir/data" \
	--exec-root "$dir/exec" \
	--pidfile "$dir/dockerd.pid" \
	--storage-driver vfs \
	--iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
	--bridge=none --userland-proxy=false \
	--containerd-namespace pgxlanes --containerd-plugins-namespace pgxlanes-plugins \
	--log-level warn \
	>"$dir/dockerd.log" 2>&1 </dev/null 9>&- &
dockerd_pid=$!
for _ in $(seq 1 300); do
	if dockercli version >/dev/null 2>&1; then break; fi
	if ! kill -0 "$dockerd_pid" 2>/dev/null; then
		wait "$dockerd_pid" 2>/dev/null
		dockerd_pid=""
		tail -n 20 "$dir/dockerd.log" >&2
		provision_failed "dockerd exited at start (log: $dir/dockerd.log)"
	fi
	sleep 0.1
done
dockercli version >/dev/null 2>&1 || provision_failed "dockerd does not answer on $sock after 30s (log: $dir/dockerd.log)"
# What an earlier run that was killed left in the data root: not this run's failure.
stale="$(dockercli ps -aq)"
if [ -n "$stale" ]; then
	echo "removing containers an earlier run left behind: ${stale//$'\n'/ }"
	# shellcheck disable=SC2086
	dockercli rm -f $stale >/dev/null
fi
for nid in $(dockercli network ls -q --filter type=custom); do dockercli network rm "$nid" >/dev/null; done
timings+=("dockerd start: $(elapsed "$t")s (pid $dockerd_pid, $(dockercli version -f 'engine {{.Server.Version}}, API {{.Server.APIVersion}}'))")

# The image's tag names what it is built from, so that a change to any of it builds a new one.
pgversion="$(for d in /usr/lib/postgresql/*/bin; do [ -x "$d/postgres" ] && "$d/postgres" --version; done 2>/dev/null | sort -V | tail -n 1)"
[ -n "$pgversion" ] || provision_failed "no PostgreSQL binaries under /usr/lib/postgresql/*/bin to build the image from"
major="$(ls -d /usr/lib/postgresql/*/ | sort -V | tail -n 1 | xargs basename)"
hash="$({ echo "$pgversion"; cat .ci/containers/build-image.sh pgxlanestest/containers/internal/entrypoint/main.go pgxlanestest/containers/go.sum; } | sha256sum | cut -c1-12)"
image="$image_repo:$major-$hash"
t="$(now)"
if dockercli image inspect "$image" >/dev/null 2>&1; then
	timings+=("image: none ($image is there)")
else
	old_images="$(dockercli images -q "$image_repo")"
	if [ -n "$old_images" ]; then
		# shellcheck disable=SC2086
		dockercli rmi -f $old_images >/dev/null 2>&1 || true
	fi
	if ! DOCKER_HOST="unix://$sock" bash .ci/containers/build-image.sh "$image" >"$logs/image.log" 2>&1; then
		tail -n 20 "$logs/image.log" >&2
		provision_failed "build-image.sh failed to build $image"
	fi
	cat "$logs/image.log"
	timings+=("image build: $(elapsed "$t")s ($image)")
fi

# --- test --------------------------------------------------------------------------------------

export DOCKER_HOST="unix://$sock"
export TESTCONTAINERS_RYUK_DISABLED=true
export PGXLANES_TEST_DOCKER=1
export PGXLANES_TEST_DOCKER_NETWORK=host
export PGXLANES_TEST_IMAGE="$image"
unset PGXLANES_TEST_DATABASE DOCKER_CONTEXT DOCKER_TLS_VERIFY DOCKER_CERT_PATH TESTCONTAINERS_HOST_OVERRIDE

failed=()

# gotest NAME DIR NEED ARGS...: runs go test -v ARGS in DIR, keeps the whole output in
# $logs/NAME.log and shows it without the -v chatter and testcontainers' progress lines. Then
# checks the sources: no harness start may have used anything but Docker, every container must be
# of $image, and with NEED=1 there must have been a harness start at all.
gotest() {
	local name="$1" where="$2" need="$3"
	shift 3
	say "go test $* in $where (Docker path, image $image)"
	local t rc
	t="$(now)"
	(cd "$where" && go test -race -count=1 -timeout 30m -v "$@") >"$logs/$name.log" 2>&1 9>&- &
	local pid=$!
	# Progress: the filter below hides the -v chatter, so every 30 s a line says how far it got.
	(
		while sleep 30; do
			kill -0 "$pid" 2>/dev/null || break
			printf '   ... %s: %ds, %d tests passed, %d skipped, %d failed so far; last started: %s\n' "$name" \
				"$(awk -v a="$t" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", b - a }')" \
				"$(grep -c -E '^[[:space:]]*--- PASS' "$logs/$name.log")" \
				"$(grep -c -E '^[[:space:]]*--- SKIP' "$logs/$name.log")" \
				"$(grep -c -E '^[[:space:]]*--- FAIL' "$logs/$name.log")" \
				"$(grep -E '^=== RUN' "$logs/$name.log" | tail -n 1 | awk '{ print $3 }')"
		done
	) 9>&- &
	local progress=$!
	tail -n +1 -f --pid "$pid" "$logs/$name.log" |
		grep --line-buffered -v -E '^(=== (RUN|PAUSE|CONT|NAME)|[[:space:]]*--- (PASS|SKIP)|[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9:]{8} (🐳|✅|⏳|🔔|🚫|🛑|⚠))'
	wait "$pid"
	rc=$?
	kill "$progress" 2>/dev/null
	wait "$progress" 2>/dev/null
	timings+=("go test $name: $(elapsed "$t")s")

	local docker_starts other_starts foreign
	docker_starts="$(grep -c '^harness: using Docker at ' "$logs/$name.log")"
	other_starts="$(grep '^harness: using ' "$logs/$name.log" | grep -v '^harness: using Docker at ' || true)"
	foreign="$(grep '^containers: PostgreSQL container ' "$logs/$name.log" | grep -v -F "from image $image " || true)"
	echo "test-containers: $name: $docker_starts harness start(s) on Docker, $(grep -c '^containers: PostgreSQL container ' "$logs/$name.log") container(s)"
	if [ "$rc" -ne 0 ]; then
		failed+=("$name: go test exit $rc")
	fi
	if [ -n "$other_starts" ]; then
		echo "test-containers: $name: the harness used another source than Docker:" >&2
		echo "$other_starts" >&2
		failed+=("$name: source not docker")
	fi
	if [ -n "$foreign" ]; then
		echo "test-containers: $name: containers not of $image:" >&2
		echo "$foreign" >&2
		failed+=("$name: wrong image")
	fi
	if [ "$need" -eq 1 ] && [ "$docker_starts" -eq 0 ]; then
		failed+=("$name: no harness start on Docker")
	fi
}

# The step's own tests start containers without the harness.
gotest containers pgxlanestest/containers 0 ./...

# internal/pgserver and pgxlanestest are in the library's module, which must not require the
# Docker step's module (that would put testcontainers in every importer's module graph). Their
# tests link the step here only: a workspace of both modules, and an overlay that adds one test
# file importing it to each package.
ws="$(mktemp -d /tmp/pgxlanes-ws.XXXXXX)"
printf 'go %s\n\nuse (\n\t%s\n\t%s/pgxlanestest/containers\n)\n' \
	"$(awk '$1 == "go" { print $2; exit }' go.mod)" "$repo" "$repo" >"$ws/go.work"
printf 'package pgserver_test\n\nimport _ "github.com/pgxlanes/pgxlanes/pgxlanestest/containers"\n' >"$ws/pgserver_docker_step_test.go"
printf 'package pgxlanestest_test\n\nimport _ "github.com/pgxlanes/pgxlanes/pgxlanestest/containers"\n' >"$ws/pgxlanestest_docker_step_test.go"
printf '{"Replace": {"%s/internal/pgserver/zz_docker_step_test.go": "%s/pgserver_docker_step_test.go", "%s/pgxlanestest/zz_docker_step_test.go": "%s/pgxlanestest_docker_step_test.go"}}\n' \
	"$repo" "$ws" "$repo" "$ws" >"$ws/overlay.json"
# The harness's tests of a server whatever its source (harness_test.go); its other tests start
# local servers on purpose (faults, restarts) and have run in make test.
GOWORK="$ws/go.work" gotest pgserver . 1 -overlay "$ws/overlay.json" \
	-run '^(TestServerAnswers|TestCreateDatabaseIsolated|TestDropDatabase|TestDSNHasPassword)$' ./internal/pgserver
GOWORK="$ws/go.work" gotest pgxlanestest . 1 -overlay "$ws/overlay.json" ./pgxlanestest/...
rm -rf "$ws"

# --- tear down ---------------------------------------------------------------------------------

say "tear down"
t="$(now)"
if ! teardown; then
	failed+=("teardown")
fi
trap - EXIT
timings+=("tear down: $(elapsed "$t")s")

say "timings"
printf '  %s\n' "${timings[@]}"

if [ "${#failed[@]}" -gt 0 ]; then
	echo "test-containers: the full test output is in $logs" >&2
	kind=tests
	if [ "${failed[*]}" = teardown ]; then kind=teardown; fi
	joined="$(printf '%s; ' "${failed[@]}")"
	joined="${joined%; }"
	set_status "$kind: $joined"
	echo "test-containers: FAILED: $joined" >&2
	exit 1
fi
rm -rf "$logs"
set_status ok
echo "test-containers: the Docker path passed"
