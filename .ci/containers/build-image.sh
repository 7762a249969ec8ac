#!/usr/bin/env bash
# build-image.sh TAG: builds a PostgreSQL image from this machine's own PostgreSQL binaries with
# `docker import`, for machines that reach no image registry. DOCKER_HOST names the engine.
#
# The image holds /usr/lib/postgresql/<major> (without the LLVM JIT), /usr/share/postgresql/<major>,
# the shared libraries that ldd finds for them, /usr/share/zoneinfo (Debian's PostgreSQL uses the
# system time zones), /bin/sh and locale (initdb runs them through popen), an /etc/passwd with the
# user postgres (uid 999, as in the official image), and a static Go entrypoint
# (pgxlanestest/containers/internal/entrypoint) that does what the official image's
# docker-entrypoint.sh does for testcontainers' Postgres module: POSTGRES_USER, POSTGRES_PASSWORD,
# POSTGRES_DB, initdb on first start, then postgres with the container's arguments.
set -euo pipefail

tag="${1:?usage: build-image.sh TAG}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"

pgdir="$(ls -d /usr/lib/postgresql/*/ 2>/dev/null | sort -V | tail -n 1)"
pgdir="${pgdir%/}"
major="${pgdir##*/}"
if [ -z "$major" ] || [ ! -x "$pgdir/bin/postgres" ] || [ ! -x "$pgdir/bin/initdb" ]; then
	echo "build-image.sh: no PostgreSQL binaries under /usr/lib/postgresql/*/bin" >&2
	exit 1
fi
share="/usr/share/postgresql/$major"
if [ ! -d "$share" ]; then
	echo "build-image.sh: $share is missing" >&2
	exit 1
fi

stage="$(mktemp -d /tmp/pgxlanes-image.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
chmod 755 "$stage" # mktemp made it 0700: it becomes the image's /

# Debian 12 links /bin, /sbin, /lib and /lib64 into /usr: keep the same layout, so that the
# binaries' loader path (/lib64/ld-linux-x86-64.so.2) and library paths resolve as on the host.
for d in bin sbin lib lib64; do
	if [ -L "/$d" ]; then
		ln -s "$(readlink "/$d")" "$stage/$d"
	fi
done

# copy_as_named PATH: copies the file PATH points to into the image at PATH, with its directory
# resolved (/lib/x86_64-linux-gnu -> /usr/lib/x86_64-linux-gnu) and its own name kept (a library's
# soname is often a symbolic link to a versioned file).
copy_as_named() {
	local dir
	dir="$(readlink -f "$(dirname "$1")")"
	mkdir -p "$stage$dir"
	cp -L "$1" "$stage$dir/"
}

mkdir -p "$stage$pgdir"
cp -a "$pgdir/bin" "$stage$pgdir/"
mkdir -p "$stage$pgdir/lib"
find "$pgdir/lib" -maxdepth 1 -type f ! -name 'llvmjit*' -exec cp -a {} "$stage$pgdir/lib/" \;
mkdir -p "$stage/usr/share/postgresql"
cp -a "$share" "$stage/usr/share/postgresql/"
mkdir -p "$stage/usr/share"
cp -a /usr/share/zoneinfo "$stage/usr/share/"
copy_as_named /bin/sh
# initdb asks `locale -a` for the collations to import; C.utf8 is the one locale Debian's libc ships.
copy_as_named /usr/bin/locale
if [ -d /usr/lib/locale/C.utf8 ]; then
	mkdir -p "$stage/usr/lib/locale"
	cp -a /usr/lib/locale/C.utf8 "$stage/usr/lib/locale/"
fi

# The shared libraries of every binary and module, and the loader.
libs="$(
	for f in "$stage$pgdir"/bin/* "$stage$pgdir"/lib/*.so /bin/sh /usr/bin/locale; do
		ldd "$f" 2>/dev/null || true
	done | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u
)"
if grep -q 'not found' < <(for f in "$stage$pgdir"/bin/*; do ldd "$f" 2>/dev/null || true; done); then
	echo "build-image.sh: a PostgreSQL binary has a missing shared library (ldd says 'not found')" >&2
	exit 1
fi
for lib in $libs; do
	copy_as_named "$lib"
done

# The entrypoint: static, so that it needs none of the libraries above.
(cd "$repo/pgxlanestest/containers" &&
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$stage/usr/local/bin/docker-entrypoint" ./internal/entrypoint)

mkdir -p "$stage/etc" "$stage/tmp" "$stage/var/lib/postgresql" "$stage/var/run/postgresql" \
	"$stage/docker-entrypoint-initdb.d"
chmod 1777 "$stage/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:PostgreSQL administrator:/var/lib/postgresql:/bin/sh\n' >"$stage/etc/passwd"
printf 'root:x:0:\npostgres:x:999:\n' >"$stage/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files\n' >"$stage/etc/nsswitch.conf"
chown -R 999:999 "$stage/var/lib/postgresql" "$stage/var/run/postgresql"
chmod 2775 "$stage/var/run/postgresql"
# Everything readable by postgres.
chmod -R a+rX "$stage/usr" "$stage/etc"

tar -C "$stage" --numeric-owner -cf - . | docker import \
	--change "ENV PATH=$pgdir/bin:/usr/local/bin:/usr/bin:/bin" \
	--change 'ENV PGDATA=/var/lib/postgresql/data' \
	--change 'USER 999:999' \
	--change 'WORKDIR /var/lib/postgresql' \
	--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint"]' \
	--change 'CMD ["postgres"]' \
	--change 'EXPOSE 5432/tcp' \
	--change "LABEL org.pgxlanes.source=local-binaries org.pgxlanes.postgres=$major" \
	- "$tag" >/dev/null
echo "build-image.sh: built $tag from $pgdir ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
