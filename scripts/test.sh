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
exec python -m pytest -q --durations=30 "$@"
