#!/usr/bin/env bash
# The main job: set up (or reuse) everything, then deploy the `cpu-rehearsal-smollm2` profile (a real
# chat model, python/specdeploy/rehearsal/deploy.py PROFILE) with
# `ansible-playbook deploy.yml -l rehearsal` over real SSH to a disposable systemd host
# (a podman container booted from a cached Debian trixie image, running podman itself; created
# when missing, reused when running) the way a GPU host is deployed: the engine image built once on
# this machine (the builder), pushed to the site registry (a test container of its own) and pulled
# by digest on the host, run under quadlet, weights from a gated hub (another test container) with
# a token, an API key. Prints this run's gate report. Exit code: the gate's (0 pass, 1 fail, 2 could
# not test, 3 inconclusive, 4 not rolled back to a serving stack; docs/commands.md "Exit codes"), or 2
# when the play stopped before the gate.
# Extra arguments go to `specdeploy rehearsal deploy` (e.g. --remove-host).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/system-deps.sh"
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
export PATH="$venv/bin:$PATH"
exec specdeploy rehearsal deploy "$@"
