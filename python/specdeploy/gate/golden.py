"""Golden transcripts keyed by the served identity: a changed output under an unchanged stack is drift.

A golden transcript (the greedy outputs of the smoke's coherence prompts) means something only for
the stack that produced it: the execution mode alone changed 3 of 39 greedy outputs on a real GPU
(docs/sources.md#judging). So the gate keys each golden by the identity of what serves: the engine
and its pinned version and commit, the image the unit runs (its ID), the weight, config and image
hashes the host's lock holds for the profile, and the profile's serve and speculative sections.

| the gate finds | it does |
|---|---|
| a golden for this identity | compares with it: a changed output fails (golden drift) |
| none (a first deploy, an intentional upgrade) | records one in the run's directory; a pass adopts it |

Goldens live in `<state>/golden/<key>.json` (core.layout); an upgrade's new golden never replaces the
old identity's, so a rollback to the previous stack finds its golden again. At most KEEP are kept,
never the one the verified run used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files, layout
from specdeploy.core.errors import SpecdeployError
from specdeploy.images import prune as image_prune
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock

KEEP = 20
RECORDED = "golden.json"  # in a run's directory: what its smoke recorded, adopted when it passes


def served_identity(profile: Profile, host: layout.HostLayout, *, unit_file: Path, podman: str) -> dict[str, Any]:
    """What a golden transcript belongs to. The smoke's identity stage proves the served version is
    the pinned one, so the pinned version stands for it here."""
    engine = profile.engine
    commit = engine.source.commit
    lock = Lock(host.lock).data.get("profiles", {}).get(profile.name, {}) if host.lock.is_file() else {}
    digest = (lock.get("engine.image.digest") or {}).get("value") if engine.runtime == "container" else None
    return {
        "engine": engine.kind,
        "version": engine.source.version.value,
        "commit": commit.value if commit is not None else None,
        "image_id": _image_id(unit_file, podman) if engine.runtime == "container" else None,
        # the registry's digest of the image (the site's lock records it at the push; a host pulls by it)
        "image_digest": digest,
        # the weight, config and image hashes the lock holds for the profile, as one digest
        "lock_sha256": hashlib.sha256(json.dumps(lock, sort_keys=True).encode()).hexdigest(),
        "serve": engine.serve.model_dump(mode="json"),
        "speculative": engine.speculative.model_dump(mode="json"),
        "env": dict(engine.env),
    }


def _image_id(unit_file: Path, podman: str) -> str | None:
    """The ID of the image the engine unit runs (its Image=), or None where it cannot be told."""
    if not unit_file.is_file():
        return None
    images = image_prune.unit_images(files.read_text(unit_file, what="engine unit", limit=files.LIMITS["json"]))
    if not images:
        return None
    try:
        return image_prune.local_image_id(podman, images[0])
    except (SpecdeployError, OSError):  # no podman here: the identity says so
        return None


# Fields shown and compared (migrate verify) but not keyed: `image_digest` is the lock entry
# `lock_sha256` already hashes, and keying it would have orphaned every golden recorded before it.
NOT_KEYED = frozenset({"image_digest"})


def key(identity: dict[str, Any]) -> str:
    keyed = {name: value for name, value in identity.items() if name not in NOT_KEYED}
    canonical = json.dumps(keyed, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def path(host: layout.HostLayout, identity_key: str) -> Path:
    return host.golden / f"{identity_key}.json"


def adopt(host: layout.HostLayout, identity_key: str, identity: dict[str, Any], recorded: Path) -> Path:
    """Keep a passing run's recorded transcript as its identity's golden (atomically), with the
    identity beside the outputs so a reader sees what it belongs to."""
    record = files.read_json(recorded, what="recorded golden transcript")
    target = path(host, identity_key)
    atomic.ensure_dir(host.golden)
    atomic.write_json(target, {**record, "identity_key": identity_key, "identity": identity}, mode=0o640)
    _prune(host, keep={target})
    return target


def _prune(host: layout.HostLayout, *, keep: set[Path]) -> None:
    goldens = sorted(host.golden.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in goldens[KEEP:]:
        if old not in keep:
            old.unlink(missing_ok=True)


class GoldenRecordError(SpecdeployError):
    exit_code = 1


def record_serving(
    profile: Profile, host: layout.HostLayout, identity: dict[str, Any], *, endpoint: str, api_key: str | None
) -> Path:
    """A golden for the identity a host serves now, from its engine: the smoke's readiness, then its
    coherence prompts one at a time (greedy, read-only, a handful of requests: no load on a serving
    host), adopted only when the known answers meet the profile's accuracy floor and no output is
    degenerate. `migrate plan` uses it for a host whose verified run predates goldens. The existing
    golden of that identity is kept."""
    from specdeploy.core.verdicts import Verdict
    from specdeploy.smoke import run as stages  # the smoke's clients: only when recording
    from specdeploy.smoke.checks import accuracy, coherence, golden, readiness

    identity_key = key(identity)
    if path(host, identity_key).is_file():
        return path(host, identity_key)
    atomic.ensure_dir(host.golden)
    recorded = host.golden / f".recording-{identity_key}.json"
    run = stages.Smoke(
        profile, endpoint, stages.SmokeOptions(record_golden=recorded, api_key=api_key, show_progress=False)
    )
    try:
        for check in (readiness.check, coherence.check, accuracy.check, golden.check):
            stage = check(run)
            run.report.stages.append(stage)
            if stage.status is not Verdict.passed:
                raise GoldenRecordError(
                    f"no golden recorded for identity {identity_key}: the {stage.name} stage did not pass "
                    f"({stage.summary})",
                    hint="a golden is recorded only from a stack that answers right: run `specdeploy gate` on this "
                    "host and fix what it reports",
                )
    finally:
        run.close()
    target = adopt(host, identity_key, identity, recorded)
    recorded.unlink(missing_ok=True)
    return target
