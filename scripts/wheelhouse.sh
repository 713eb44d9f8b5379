#!/usr/bin/env bash
# Build a wheelhouse for hosts: the specdeploy wheel plus every dependency, downloaded by
# the controller, and requirements.lock naming exactly those versions (hosts and
# air-gapped sites install them with --no-index --no-deps: the tested set, nothing else).
# Usage:  scripts/wheelhouse.sh DIR [EXTRAS]     e.g. scripts/wheelhouse.sh /tmp/wh rehearsal
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:?usage: wheelhouse.sh DIR [EXTRAS]}
extras=${2:-}
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
mkdir -p "$dest"
"$venv/bin/pip" download --quiet --only-binary=:all: --dest "$dest" "$spec" 2>&1 \
  | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
# PyPI's torchvision/torchaudio/torchcodec break transformers beside the CPU torch (FACTS 5).
rm -f "$dest"/specdeploy-* "$dest"/torchvision-* "$dest"/torchaudio-* "$dest"/torchcodec-*
"$venv/bin/pip" wheel --quiet --no-deps --no-build-isolation --wheel-dir "$dest" "$root" >&2
"$venv/bin/python" - "$dest" <<'PY'
import sys
from pathlib import Path
from packaging.utils import parse_wheel_filename
dest = Path(sys.argv[1])
pins = sorted(f"{name}=={version}" for name, version, _, _ in map(parse_wheel_filename, (p.name for p in dest.glob("*.whl"))))
(dest / "requirements.lock").write_text("\n".join(pins) + "\n")
PY
echo "$dest"
