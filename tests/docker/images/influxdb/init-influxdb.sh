#!/bin/bash
# First start only (no meta directory yet), as the official influxdb:1.8 image does: when
# INFLUXDB_DB is set or /docker-entrypoint-initdb.d has files, run influxd on 127.0.0.1 alone,
# create INFLUXDB_DB, run each *.iql (through the influx CLI) and *.sh, then stop it again.
# With INFLUXDB_ADMIN_USER it creates that admin first (InfluxDB allows only that while no admin
# exists), then, as the admin, the database, INFLUXDB_WRITE_USER (WRITE on it) and
# INFLUXDB_READ_USER (READ on it) with their *_PASSWORD variables, as the official script does.
set -e

meta_dir=${INFLUXDB_META_DIR:-/var/lib/influxdb/meta}
init_dir=/docker-entrypoint-initdb.d
if [ -d "$meta_dir" ]; then
    exit 0
fi
if [ -z "$INFLUXDB_DB" ] && [ -z "$(ls -A "$init_dir" 2>/dev/null)" ]; then
    exit 0
fi

port=${INFLUXDB_INIT_PORT:-8086}
INFLUXDB_HTTP_BIND_ADDRESS=127.0.0.1:$port INFLUXDB_HTTP_HTTPS_ENABLED=false influxd "$@" &
pid=$!
influx_cmd=(influx -host 127.0.0.1 -port "$port" -execute)

query="SHOW DATABASES"
[ -n "$INFLUXDB_DB" ] && query="CREATE DATABASE $INFLUXDB_DB"
[ -n "$INFLUXDB_ADMIN_USER" ] \
    && query="CREATE USER \"$INFLUXDB_ADMIN_USER\" WITH PASSWORD '$INFLUXDB_ADMIN_PASSWORD' WITH ALL PRIVILEGES"
for i in {30..0}; do
    if "${influx_cmd[@]}" "$query" >/dev/null 2>&1; then
        break
    fi
    echo 'influxdb init process in progress...'
    sleep 1
done
if [ "$i" = 0 ]; then
    echo >&2 'influxdb init process failed.'
    exit 1
fi

if [ -n "$INFLUXDB_ADMIN_USER" ]; then
    influx_cmd=(influx -host 127.0.0.1 -port "$port" -username "$INFLUXDB_ADMIN_USER"
        -password "$INFLUXDB_ADMIN_PASSWORD" -execute)
    [ -n "$INFLUXDB_DB" ] && "${influx_cmd[@]}" "CREATE DATABASE $INFLUXDB_DB"
fi
for role in WRITE READ; do
    user_var="INFLUXDB_${role}_USER" password_var="INFLUXDB_${role}_USER_PASSWORD"
    [ -n "${!user_var}" ] || continue
    "${influx_cmd[@]}" "CREATE USER \"${!user_var}\" WITH PASSWORD '${!password_var}'"
    "${influx_cmd[@]}" "REVOKE ALL PRIVILEGES FROM \"${!user_var}\""
    [ -n "$INFLUXDB_DB" ] && "${influx_cmd[@]}" "GRANT $role ON \"$INFLUXDB_DB\" TO \"${!user_var}\""
done

# *.sh files are sourced, as the official image does.
# shellcheck disable=SC1090
for f in "$init_dir"/*; do
    [ -e "$f" ] || continue
    case "$f" in
        *.sh) echo "$0: running $f"; . "$f" ;;
        *.iql) echo "$0: running $f"; "${influx_cmd[@]}" "$(cat "$f")"; echo ;;
        *) echo "$0: ignoring $f" ;;
    esac
done

if ! kill -s TERM "$pid" || ! wait "$pid"; then
    echo >&2 'influxdb init process failed. (Could not stop influxdb)'
    exit 1
fi
