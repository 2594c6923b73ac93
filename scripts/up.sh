#!/usr/bin/env bash
# Bring up broker (mosquitto, 256 KiB packets), object store (SeaweedFS S3) and gateway on
# loopback, run a self-check (a 20 MiB message across the 256 KiB broker), then serve until
# Ctrl-C. `scripts/up.sh --check` exits after the self-check; `--clean` erases the data, logs
# and logins an earlier run kept. Ports and state directory: see scripts/stack.py
# (STACK_*_PORT, STACK_DIR).
source "$(dirname "$0")/_bootstrap.sh"
exec python scripts/stack.py "$@"
