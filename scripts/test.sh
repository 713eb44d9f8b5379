#!/usr/bin/env bash
# Set up (or reuse) everything and run all tests: lint, unit tests, and the integration
# tests that start real vLLM-CPU servers. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/system-deps.sh
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
