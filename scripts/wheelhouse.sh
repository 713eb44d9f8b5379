#!/usr/bin/env bash
# Build a wheelhouse for hosts, downloaded by the controller: exactly the wheels of a hash lock
# (locks/, docs/locks-and-nix.md "Locks"), downloaded with --require-hashes, and that lock inside each archive
# as requirements.lock. Hosts and air-gapped sites install exactly it with
# `pip install --require-hashes --no-index --no-deps`: nothing resolved, no byte unverified.
# Each set is one archive: Ansible copies it with one checksum on each side, not a round trip
# per wheel.
#
#   wheelhouse.sh DIR                          the CLI, for this Python and each of HOST_PYTHONS:
#     DIR/deps.tar                               its dependency wheels + requirements.lock
#                                                (locks/host-cli.txt)
#     DIR/requirements.lock                      the same lock, to read without unpacking
#     DIR/specdeploy-*.whl                       the CLI itself (rebuilt when the checkout changes)
#     DIR/specdeploy.lock                        its sha256, computed when it is built
#   wheelhouse.sh DIR --engine PACKAGE==VERSION  one engine for venv-runtime profiles and the CPU image:
#     DIR/engines/PACKAGE-VERSION.tar            its wheels + requirements.lock (locks/engine-*.txt;
#                                                the engine role builds a venv of it beside the
#                                                previous engine's)
set -euo pipefail
# The hosts' Pythons besides this one: Debian trixie's (the rehearsal host, a GPU host on trixie)
# is 3.13, the controller's 3.11. One lock for all: the same versions, a wheel per Python.
HOST_PYTHONS=(3.13)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage="usage: wheelhouse.sh DIR | wheelhouse.sh DIR --engine PACKAGE==VERSION"
dest=${1:?$usage}
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
envlock() { "$venv/bin/python" -m specdeploy.core.envlock "$@"; }
mkdir -p "$dest"

download() {  # download WHEELS_DIR LOCK [PIP OPTIONS...]: exactly the lock's wheels, hashes checked
  local wheels=$1 lock=$2; shift 2
  envlock pip --lock "${lock#"$root"/}" -- "$venv/bin/python" -m pip download --quiet --require-hashes \
    --no-deps --only-binary=:all: --dest "$wheels" --requirement "$lock" "$@"
}

pack() {  # pack WHEELS_DIR ARCHIVE: reproducible bytes (sorted names, fixed owner and times)
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$1" -cf "$2.partial" .
  mv "$2.partial" "$2"
}

if [ "${2:-}" = "--engine" ]; then
  spec=${3:?usage: wheelhouse.sh DIR --engine PACKAGE==VERSION}
  case "$spec" in *==*) ;; *) echo "wheelhouse.sh: --engine takes PACKAGE==VERSION, found '$spec'" >&2; exit 2 ;; esac
  lock=$(envlock engine-lock "$spec")
  mkdir -p "$dest/engines"
  wheels=$(mktemp -d "$dest/engines/.wheels.XXXXXX")
  trap 'rm -rf "$wheels"' EXIT
  download "$wheels" "$lock"
  cp "$lock" "$wheels/requirements.lock"
  pack "$wheels" "$dest/engines/${spec/==/-}.tar"
  echo "$dest/engines/${spec/==/-}.tar"
  exit 0
fi
if [ $# -gt 1 ]; then
  echo "wheelhouse.sh: unexpected '${*:2}': the CLI's wheelhouse is locks/host-cli.txt, nothing else;" \
    "an engine is its own archive (--engine PACKAGE==VERSION)" >&2
  echo "$usage" >&2
  exit 2
fi

lock=$(envlock path host-cli)
wheels="$dest/wheels"
rm -rf "$wheels"
mkdir -p "$wheels"
download "$wheels" "$lock"
for version in "${HOST_PYTHONS[@]}"; do
  download "$wheels" "$lock" --python-version "$version"
done
cp "$lock" "$wheels/requirements.lock"
rm -f "$dest"/specdeploy-*.whl
"$venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$dest" "$root" >&2
envlock wheel-lock "$dest"/specdeploy-*.whl "$dest/specdeploy.lock" >/dev/null
cp "$lock" "$dest/requirements.lock"
pack "$wheels" "$dest/deps.tar"
rm -rf "$wheels"
echo "$dest"
