#!/usr/bin/env bash
# Install what the tests need, then run them: lint, types, import layers, the whole suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m "not spark"`).
BOOTSTRAP_TEST_PEERS=1 source "$(dirname "$0")/_bootstrap.sh"
echo "==> ruff"
ruff check .
ruff format --check .
echo "==> mypy"
mypy
echo "==> lint-imports (the layers: docs/development.md)"
lint-imports --no-cache --no-logo
echo "==> pytest"
# The slowest tests are listed: the whole suite must stay under 20 minutes on 2 cores.
# Two workers (pytest-xdist): most tests wait on servers, so two fill 2 cores; more would
# start more servers than the cores can serve. A file runs whole on one worker, and tests
# marked xdist_group run on one worker together (tests/conftest.py, docs/development.md).
# Later arguments win: `scripts/test.sh -n 0` runs in one process, `-n auto` a worker per core.
exec python -m pytest -q -n 2 --dist loadgroup --durations=30 "$@"
