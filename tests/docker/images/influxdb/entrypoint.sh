#!/bin/bash
# As the official influxdb:1.8 image: flags alone run influxd; influxd is initialised first.
set -e
if [ "${1:0:1}" = '-' ]; then
    set -- influxd "$@"
fi
if [ "$1" = 'influxd' ]; then
    /init-influxdb.sh "${@:2}"
fi
exec "$@"
