#!/usr/bin/env bash
# Refresh the hash locks under locks/ (docs/locks-and-nix.md "Locks"): exact versions plus the sha256 of every
# file, resolved by the uv that locks/dev.txt pins, from PyPI and, for the CPU torch, the local
# wheel folder ($SPECDEPLOY_LOCAL_WHEELS, default /opt/wheels: uv ignores pip's configuration).
# Needs PyPI. Review the diff and commit it; every install then uses the new lock.
#
#   scripts/lock.sh [NAME...]    default: every environment (dev host-cli engine-* hub-olah fixture-smollm2)
#
# uv is installed from the dev lock's own pin with its hashes into a small cached venv, so this
# works while the other pins of the dev lock are stale (the point of running it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
python=${PYTHON:-python3}
envlock() { PYTHONPATH="$root/python" "$python" -m specdeploy.core.envlock "$@"; }
pin=$(envlock pin-only dev uv)
tool="$cache/uv-$(echo "$pin" | sha256sum | cut -c1-12)"
if [ ! -x "$tool/bin/uv" ]; then
  rm -rf "$tool"
  "$python" -m venv "$tool"
  echo "$pin" > "$tool/requirements.lock"
  envlock pip --lock locks/dev.txt -- "$tool/bin/pip" install --quiet --require-hashes --no-deps \
    --requirement "$tool/requirements.lock"
fi
envlock compile --uv "$tool/bin/uv" "$@"
envlock check
