#!/usr/bin/env bash
# Create (or reuse) the project's venvs and install this checkout into its own (docs/locks-and-nix.md "Locks").
#
#   $SPECDEPLOY_CACHE/venv-KEY  (default cache ~/.cache/specdeploy) the dependencies: exactly
#       locks/dev.txt, installed with `pip --require-hashes --no-deps` (nothing resolved), without
#       specdeploy itself; shared by every checkout on this machine, keyed by the lock's hash and
#       the Python; built once (about 3 minutes, ~3 GB with torch), then reused in seconds.
#   $root/.venv  this checkout's own venv: it sees the shared venv's packages (a .pth), has every
#       program of the shared venv's bin rewritten to run with its own python, and this checkout
#       installed editable (--no-deps). Two checkouts on one machine never test each other's code.
#
# Prints this checkout's venv path last (test.sh, rehearse.sh, wheelhouse.sh use "$venv/bin/...").
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
python=${PYTHON:-python3}
lock="$root/locks/dev.txt"
layout=2  # bump when the steps below change what a shared venv holds
envlock() { PYTHONPATH="$root/python" "$python" -m specdeploy.core.envlock "$@"; }

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
  echo "setup: locks/dev.txt is locked for Python 3.11, but $python is Python $version; nothing was installed" >&2
  echo "  fix: run with PYTHON=python3.11 (or refresh the lock for another Python with scripts/lock.sh)" >&2
  exit 2
fi
# A pin bumped in pyproject.toml without refreshing the lock: refuse, naming the pin.
envlock check
# Keyed by the pins and hashes only: a reworded header or annotation rebuilds nothing.
key=$( (echo "layout $layout python $version"; grep -v '^[[:space:]]*#' "$lock") | sha256sum | cut -c1-12)
shared="$cache/venv-$key"

mkdir -p "$cache"
# One builder at a time: CI and a developer (or two CI clones) may run this concurrently.
exec 9>"$cache/setup.lock"
flock 9
if [ ! -f "$shared/.complete" ]; then
  echo "setup: building $shared from locks/dev.txt (the lock changed or first run)" >&2
  rm -rf "$shared"
  "$python" -m venv "$shared"
  # The CPU torch is not on PyPI: pip finds it in the CI machines' local wheels (PIP_FIND_LINKS,
  # /opt/wheels); elsewhere put that same file in a folder PIP_FIND_LINKS names (the lock's header).
  envlock pip --lock locks/dev.txt -- "$shared/bin/pip" install --quiet --require-hashes --no-deps \
    --requirement "$lock"
  touch "$shared/.complete"
fi
# The venvs of older locks: keep the most recently used other one, remove the rest (each ~4 GB).
PYTHONPATH="$root/python" "$python" -m specdeploy.rehearsal.housekeeping prune venv "venv-$key" --cache "$cache"
# (still under the lock: two setups of one checkout must not rebuild its .venv at once)

venv="$root/.venv"
envlock checkout-venv "$shared" "$venv" >/dev/null
# The checkout itself, editable and without dependencies (they are the shared venv's).
envlock pip --lock locks/dev.txt -- "$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation \
  --editable "$root"
echo "$venv"
