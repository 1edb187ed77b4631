#!/usr/bin/env bash
# CI only (issue 12): a real Docker engine on CI's machine (Debian 12, root, no systemd, only the
# package registries reachable). Users never run this; they have their own engine.
#
#   .ci/docker-engine.sh install   # idempotent: trixie's docker.io (Engine >= 25 for healthcheck
#                                  # start_interval), its CLI, Compose v2, buildx; debootstrap
#   .ci/docker-engine.sh start     # containerd + dockerd in the background; waits for `docker info`
#   .ci/docker-engine.sh stop      # dockerd, then containerd; images stay in the data root
#   .ci/docker-engine.sh start-load  # a second dockerd, the tests' load host (k6), on
#                                    # unix:///var/run/protolab-load/docker.sock; it shares the
#                                    # first one's containerd (start that first)
#   .ci/docker-engine.sh stop-load   # that dockerd, then its bridge ci-load0 (stop does it too)
#   .ci/docker-engine.sh load-image IMAGE  # copies IMAGE from the first engine to the load engine
#                                          # unless the load engine has it with the same id
#   .ci/docker-engine.sh reserve-ports COMPOSE_FILE  # keeps outgoing connections off the host
#                                          # ports the file publishes in the ephemeral range
#   .ci/docker-engine.sh ephemeral-ports COMPOSE_FILE  # prints those ports
#
# Bookworm's docker.io (20.10) is too old. Trixie's docker.io, docker-compose (the v2 plugin) and
# docker-buildx install on bookworm from a trixie source pinned at priority 100: only the packages
# named below (and what they cannot get from bookworm) come from trixie.
set -euo pipefail

STATE_DIR=${DOCKER_ENGINE_STATE:-/var/run/protolab-docker}
DATA_ROOT=${DOCKER_DATA_ROOT:-/var/lib/docker}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/protolab-dockerd.log}
CONTAINERD_LOG=${CONTAINERD_LOG:-/var/log/protolab-containerd.log}
START_TIMEOUT=${DOCKERD_START_TIMEOUT:-60}
# The load engine: a second dockerd with its own socket, roots, pidfile, log and bridge.
LOAD_SOCKET=${DOCKER_LOAD_SOCKET:-/var/run/protolab-load/docker.sock}
LOAD_STATE_DIR=${DOCKER_LOAD_STATE:-/var/run/protolab-load}
LOAD_DATA_ROOT=${DOCKER_LOAD_DATA_ROOT:-/var/lib/protolab-load-docker}
LOAD_EXEC_ROOT=${DOCKER_LOAD_EXEC_ROOT:-$LOAD_STATE_DIR/exec}
LOAD_DOCKERD_LOG=${DOCKERD_LOAD_LOG:-/var/log/protolab-dockerd-load.log}
# Not "plab-": the lab names its own network devices so, and tests check the host has none.
LOAD_BRIDGE=${DOCKER_LOAD_BRIDGE:-ci-load0}
LOAD_BRIDGE_ADDR=${DOCKER_LOAD_BRIDGE_ADDR:-10.213.0.1/24}
CONTAINERD_SOCKET=/run/containerd/containerd.sock
TRIXIE_SOURCES=/etc/apt/sources.list.d/protolab-trixie.sources
TRIXIE_PREFERENCES=/etc/apt/preferences.d/protolab-trixie.pref
FROM_TRIXIE=(docker.io docker-cli docker-compose docker-buildx)
FROM_BOOKWORM=(debootstrap iptables ca-certificates)

log() { printf '[docker-engine] %s\n' "$*" >&2; }

# The Debian mirror the host already uses (debian.sources or sources.list), for the trixie line.
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

versions() {
    log "versions (docker on PATH: $(command -v docker)):"
    docker --version
    /usr/bin/docker --version
    dockerd --version
    containerd --version
    runc --version | head -n1
    docker compose version
    docker buildx version
    debootstrap --version
}

cmd_install() {
    local mirror
    mirror=$(debian_mirror)
    if [[ ! -f $TRIXIE_SOURCES ]] || ! grep -q "^URIs: $mirror\$" "$TRIXIE_SOURCES"; then
        log "adding trixie ($mirror), pinned at 100"
        cat >"$TRIXIE_SOURCES" <<EOF
# protolab CI (.ci/docker-engine.sh): Docker Engine >= 25 from trixie; see $TRIXIE_PREFERENCES
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    fi
    cat >"$TRIXIE_PREFERENCES" <<'EOF'
# protolab CI (.ci/docker-engine.sh): nothing comes from trixie unless asked for by name.
Package: *
Pin: release n=trixie
Pin-Priority: 100
EOF
    local want=() pkg
    for pkg in "${FROM_TRIXIE[@]}"; do
        # Installed and from trixie (not bookworm's 20.10): nothing to do.
        if ! dpkg-query -W -f='${Status} ${Version}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed' \
            || [[ $pkg == docker.io && $(dpkg-query -W -f='${Version}' docker.io) == 20.* ]]; then
            want+=("$pkg/trixie")
        fi
    done
    for pkg in "${FROM_BOOKWORM[@]}"; do
        dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed' || want+=("$pkg")
    done
    if ((${#want[@]})); then
        log "installing: ${want[*]}"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        # No daemon is started by the packages' scripts (there is no systemd; policy-rc.d says no).
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${want[@]}"
    else
        log "already installed"
    fi
    versions
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

tail_logs() {
    log "--- last lines of $DOCKERD_LOG ---"
    tail -n 40 "$DOCKERD_LOG" >&2 2>/dev/null || true
    log "--- last lines of $CONTAINERD_LOG ---"
    tail -n 8 "$CONTAINERD_LOG" >&2 2>/dev/null || true
}

cmd_start() {
    mkdir -p "$STATE_DIR" "$DATA_ROOT"
    if docker info >/dev/null 2>&1; then
        log "an engine already answers: $(docker info --format 'Server {{.ServerVersion}}')"
        return 0
    fi
    local deadline=$((SECONDS + START_TIMEOUT)) daemon
    if ! pid_alive "$STATE_DIR/containerd.pid"; then
        log "starting containerd (log: $CONTAINERD_LOG)"
        setsid containerd >>"$CONTAINERD_LOG" 2>&1 </dev/null &
        echo $! >"$STATE_DIR/containerd.pid"
    fi
    until ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1; do
        if ! pid_alive "$STATE_DIR/containerd.pid" || ((SECONDS >= deadline)); then
            tail_logs
            log "containerd did not start"
            exit 1
        fi
        sleep 0.2
    done
    if pid_alive "$STATE_DIR/dockerd.pid"; then
        daemon=$(cat "$STATE_DIR/dockerd.pid")
        log "dockerd (pid $daemon) is running but does not answer yet; waiting"
    else
        log "starting dockerd (data root: $DATA_ROOT, log: $DOCKERD_LOG)"
        # Its own pidfile and log; the default bridge and iptables as on any Debian host. Its hard
        # nofile limit is this machine's 20000 (no CAP_SYS_RESOURCE): containers get no more, so
        # tests/docker/substitutes.env sets SERVICE_NOFILE to 20000.
        setsid dockerd \
            --containerd=/run/containerd/containerd.sock \
            --data-root="$DATA_ROOT" \
            --pidfile="$STATE_DIR/dockerd.pid" \
            --host=unix:///var/run/docker.sock \
            >>"$DOCKERD_LOG" 2>&1 </dev/null &
        daemon=$!
    fi
    until docker info >/dev/null 2>&1; do
        if ! kill -0 "$daemon" 2>/dev/null; then
            tail_logs
            log "dockerd exited during start-up"
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            tail_logs
            log "dockerd did not answer \`docker info\` within ${START_TIMEOUT}s"
            exit 1
        fi
        sleep 0.5
    done
    log "dockerd ready: $(docker info --format 'Server {{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}}')"
}

stop_pid() { # pidfile name timeout
    local pidfile=$1 name=$2 timeout=$3 pid i
    pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    log "stopping $name (pid $pid)"
    kill -TERM "$pid"
    for ((i = 0; i < timeout * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
        sleep 0.1
    done
    log "$name did not stop within ${timeout}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

cmd_stop() {
    # The load engine uses this containerd: it goes first.
    if pid_alive "$LOAD_STATE_DIR/dockerd.pid"; then cmd_stop_load; fi
    # dockerd stops its running containers (their stop timeouts) before it exits.
    stop_pid "$STATE_DIR/dockerd.pid" dockerd 60
    stop_pid "$STATE_DIR/containerd.pid" containerd 20
    log "stopped"
}

load_docker() { docker -H "unix://$LOAD_SOCKET" "$@"; }

cmd_start_load() {
    mkdir -p "$LOAD_STATE_DIR" "$LOAD_DATA_ROOT" "$LOAD_EXEC_ROOT"
    if load_docker info >/dev/null 2>&1; then
        log "the load engine already answers: $(load_docker info --format 'Server {{.ServerVersion}}')"
        return 0
    fi
    # It shares the first engine's containerd (its own namespaces keep the containers apart).
    if ! ctr --address "$CONTAINERD_SOCKET" version >/dev/null 2>&1; then
        log "containerd does not answer on $CONTAINERD_SOCKET: run \`$0 start\` first"
        exit 1
    fi
    local deadline=$((SECONDS + START_TIMEOUT)) daemon
    if pid_alive "$LOAD_STATE_DIR/dockerd.pid"; then
        daemon=$(cat "$LOAD_STATE_DIR/dockerd.pid")
        log "load dockerd (pid $daemon) is running but does not answer yet; waiting"
    else
        # A second dockerd cannot share docker0, and --bip only readdresses the bridge it manages
        # (docker0 by name): the load engine gets a bridge of its own, made here, via --bridge.
        if ! ip link show "$LOAD_BRIDGE" >/dev/null 2>&1; then
            log "creating bridge $LOAD_BRIDGE ($LOAD_BRIDGE_ADDR)"
            ip link add "$LOAD_BRIDGE" type bridge
        fi
        ip addr replace "$LOAD_BRIDGE_ADDR" dev "$LOAD_BRIDGE"
        ip link set "$LOAD_BRIDGE" up
        log "starting load dockerd (socket: $LOAD_SOCKET, data root: $LOAD_DATA_ROOT, log: $LOAD_DOCKERD_LOG)"
        # No iptables rules: the first dockerd owns the DOCKER* chains and the two would rewrite
        # each other's. The load engine's containers run with --network host (k6 reaching the
        # first engine's ports on 127.0.0.1), so they need neither NAT nor published ports; on its
        # bridge a container reaches the host, but nothing beyond (FORWARD's policy is DROP).
        # No --default-address-pool: with it, a dockerd that restarts deletes the interface named
        # docker0 (moby's "clear stale bridge network"), which is the first engine's.
        setsid dockerd \
            --containerd="$CONTAINERD_SOCKET" \
            --containerd-namespace=protolab-load \
            --containerd-plugins-namespace=protolab-load-plugins \
            --data-root="$LOAD_DATA_ROOT" \
            --exec-root="$LOAD_EXEC_ROOT" \
            --pidfile="$LOAD_STATE_DIR/dockerd.pid" \
            --host="unix://$LOAD_SOCKET" \
            --bridge="$LOAD_BRIDGE" \
            --iptables=false \
            --ip-masq=false \
            --ip6tables=false \
            >>"$LOAD_DOCKERD_LOG" 2>&1 </dev/null &
        daemon=$!
    fi
    until load_docker info >/dev/null 2>&1; do
        if ! kill -0 "$daemon" 2>/dev/null || ((SECONDS >= deadline)); then
            log "--- last lines of $LOAD_DOCKERD_LOG ---"
            tail -n 40 "$LOAD_DOCKERD_LOG" >&2 2>/dev/null || true
            log "load dockerd did not answer \`docker -H unix://$LOAD_SOCKET info\` within ${START_TIMEOUT}s or exited"
            exit 1
        fi
        sleep 0.5
    done
    log "load dockerd ready: $(load_docker info --format 'Server {{.ServerVersion}}, storage {{.Driver}}')"
}

cmd_stop_load() {
    stop_pid "$LOAD_STATE_DIR/dockerd.pid" "load dockerd" 60
    if ip link show "$LOAD_BRIDGE" >/dev/null 2>&1; then
        ip link delete "$LOAD_BRIDGE"
    fi
    log "load engine stopped"
}

cmd_load_image() { # image
    local image=$1 want have
    want=$(docker image inspect --format '{{.Id}}' "$image")
    have=$(load_docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    if [[ $have == "$want" ]]; then
        log "$image: already in the load engine"
        return 0
    fi
    log "$image: copying to the load engine"
    docker save "$image" | load_docker load
}

# A host port that compose publishes inside the ephemeral range (50051, 50052) can be held by an
# outgoing connection's TIME_WAIT for 60 s: k6 and the tests before the docker phase connect to
# 127.0.0.1 thousands of times, Linux gives connect() even ports first, and a client socket has
# no SO_REUSEADDR, so the engine's `bind: address already in use` fails `compose up` (stop 48's
# CI run). Reserved ports are never given to connect(); ports already reserved stay so.
# The host ports COMPOSE_FILE publishes inside this host's ephemeral range, one a line
# (tests/integration/test_compose_safety.py holds them to compose's own reading of the file).
cmd_ephemeral_ports() {
    local low high port
    read -r low high </proc/sys/net/ipv4/ip_local_port_range
    for port in $(grep -oE '^[[:space:]]+- "[^"]*:([0-9]+):[0-9]+(/[a-z]+)?"' "$1" \
        | sed -E 's/.*:([0-9]+):[0-9]+(\/[a-z]+)?"$/\1/' | sort -un); do
        if ((port >= low && port <= high)); then echo "$port"; fi
    done
}

cmd_reserve_ports() {
    local wanted current
    wanted=$(cmd_ephemeral_ports "$1" | paste -sd, -)
    [[ -n $wanted ]] || return 0
    current=$(cat /proc/sys/net/ipv4/ip_local_reserved_ports)
    sysctl -q -w net.ipv4.ip_local_reserved_ports="${current:+$current,}$wanted"
    log "reserved from the ephemeral range: $(cat /proc/sys/net/ipv4/ip_local_reserved_ports)"
}

case ${1:-} in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
start-load) cmd_start_load ;;
stop-load) cmd_stop_load ;;
load-image)
    [[ -n ${2:-} ]] || { echo "usage: $0 load-image IMAGE" >&2; exit 2; }
    cmd_load_image "$2"
    ;;
reserve-ports | ephemeral-ports)
    [[ -n ${2:-} ]] || { echo "usage: $0 $1 COMPOSE_FILE" >&2; exit 2; }
    "cmd_${1//-/_}" "$2"
    ;;
versions) versions ;;
*)
    echo "usage: $0 install|start|stop|start-load|stop-load|load-image IMAGE|reserve-ports FILE|ephemeral-ports FILE|versions" >&2
    exit 2
    ;;
esac
