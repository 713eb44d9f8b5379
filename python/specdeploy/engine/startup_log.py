"""Read an engine's startup log for proof that the drafter is wired as the profile intends.

vLLM shifts DFlash target_layer_ids by +1 (PR #40727) and logs the result:
`Using auxiliary layers from speculative config: (2, 17, 32, 47, 62)` for [1,16,31,46,61].
A build that applies the shift twice (reported for #40898 + #40727 on top) or not at all
reads the wrong hidden states and acceptance collapses; this line is the only place the
mistake is visible before traffic, so specdeploy checks it instead of a person.
"""

from __future__ import annotations

import ast
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from specdeploy.profile import Profile

_AUX_RE = re.compile(r"Using auxiliary layers from speculative config: (\([0-9,\s]*\))")


@dataclass(frozen=True)
class AuxLayerCheck:
    expected: tuple[int, ...]
    found: tuple[int, ...] | None
    ok: bool
    message: str


def expected_aux_layers(profile: Profile) -> tuple[int, ...]:
    ids = profile.drafter_expected("target_layer_ids")
    if ids is None:
        raise ValueError(f"profile {profile.name} pins no drafter target_layer_ids")
    return tuple(i + 1 for i in ids)


def find_aux_layers(log_text: str) -> tuple[int, ...] | None:
    """The last auxiliary-layer tuple vLLM logged, or None."""
    matches = _AUX_RE.findall(log_text)
    return tuple(ast.literal_eval(matches[-1])) if matches else None


def check_aux_layers(profile: Profile, log_text: str) -> AuxLayerCheck:
    expected = expected_aux_layers(profile)
    found = find_aux_layers(log_text)
    if found is None:
        return AuxLayerCheck(
            expected, None, False,
            "vLLM logged no 'Using auxiliary layers from speculative config' line: the drafter "
            "config was not read as DFlash (check architectures and dflash_config)",
        )  # fmt: skip
    if found == expected:
        return AuxLayerCheck(expected, found, True, f"auxiliary layers {found} = target_layer_ids + 1")
    shifted = tuple(i - 1 for i in found)
    if shifted == expected:
        why = "shifted by +2: the +1 fix (#40727) is applied twice in this build"
    elif found == tuple(i - 1 for i in expected):
        why = "not shifted: this build lacks the +1 fix (#40727)"
    else:
        why = "the drafter's target_layer_ids differ from the profile's"
    return AuxLayerCheck(expected, found, False, f"expected auxiliary layers {expected}, vLLM logged {found}: {why}")


# --------------------------------------------------------------------------- from the journal


def journal_of_current_run(unit: str) -> str:
    """The unit's log lines since its current start (its systemd invocation), from journald.
    A quadlet container logging to journald runs in the unit's cgroup, so its lines carry the
    same invocation id."""
    invocation = subprocess.run(
        ["systemctl", "show", "--property=InvocationID", "--value", unit], capture_output=True, text=True
    ).stdout.strip()
    if not invocation:
        return ""
    done = subprocess.run(
        ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "--output=cat", "--no-pager"],
        capture_output=True,
        text=True,
    )
    return done.stdout


def wait_for_aux_layers(
    profile: Profile, read: Callable[[], str], *, timeout_s: float, failed: Callable[[], bool] = lambda: False
) -> AuxLayerCheck:
    """Poll the log until vLLM prints its auxiliary-layer line, the engine fails, or time runs out."""
    deadline = time.monotonic() + timeout_s
    text = read()
    while find_aux_layers(text) is None and time.monotonic() < deadline and not failed():
        time.sleep(2)
        text = read()
    return check_aux_layers(profile, text)


def unit_failed(unit: str) -> bool:
    state = subprocess.run(["systemctl", "is-failed", unit], capture_output=True, text=True)
    return state.stdout.strip() == "failed"


def check_unit(profile: Profile, unit: str, *, timeout_s: float) -> AuxLayerCheck:
    """Wait for the unit's current run to log its auxiliary layers (or fail, or time out), then check them."""
    return wait_for_aux_layers(
        profile, lambda: journal_of_current_run(unit), timeout_s=timeout_s, failed=lambda: unit_failed(unit)
    )
