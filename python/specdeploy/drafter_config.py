"""Verify a drafter's config.json against the profile and the target, and write it safely.

The field failure this prevents: a hand-built DFlash config.json with a wrong
mask_token_id, guessed target_layer_ids and no sliding-window fields ran for hours at
acceptance length 1.1 instead of ~3; the corrected file then failed to land on disk.
`verify` names every field that is off and what it costs; `write_serving_dir` builds the
directory the engine reads — never the download cache — atomically, and reads it back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdeploy import atomic, dflash_fields
from specdeploy.errors import ConfigFileError, SpecdeployError, UnresolvedPinError, WriteError
from specdeploy.lock import Lock
from specdeploy.profile import Profile
from specdeploy.rollback import Keeper

CONFIG_NAME = "config.json"
LOCK_KEY = "drafter.config.canonical_sha256"


# --------------------------------------------------------------------------- canonical form


def canonical_bytes(config: Any) -> bytes:
    """The config as canonical JSON: key order and whitespace do not change the hash."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_sha256(config: Any) -> str:
    return hashlib.sha256(canonical_bytes(config)).hexdigest()


def _same(a: Any, b: Any) -> bool:
    """Semantic equality: key order, whitespace and list-vs-tuple do not matter; types do
    (2048 and 2048.0 differ, since loaders treat them differently)."""
    return canonical_bytes(a) == canonical_bytes(b)


def _flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(config, dict):
        out: dict[str, Any] = {}
        for key, value in config.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: config}


def differing_fields(recorded: dict[str, Any], found: dict[str, Any]) -> list[str]:
    a, b = _flatten(recorded), _flatten(found)
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or not _same(a[k], b[k]))


def read_config(path: Path) -> tuple[bytes, dict[str, Any]]:
    """Read and parse a config.json; missing or non-JSON files raise ConfigFileError (exit 2)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigFileError(
            f"{path}: no such file",
            hint="fetch the drafter at the profile's pinned revision first (specdeploy fetch)",
        ) from None
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(
            f"{path}: not valid JSON ({exc})",
            hint="the file is truncated or hand-edited; re-fetch it at the pinned revision",
        ) from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return raw, data


# --------------------------------------------------------------------------- the report


@dataclass
class Check:
    field: str
    expected: Any
    found: Any
    ok: bool
    consequence: str = ""
    kind: str = "field"  # field | structure | hash


@dataclass
class Report:
    path: str
    profile: str
    checks: list[Check] = field(default_factory=list)
    canonical_sha256: str = ""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "profile": self.profile,
            "ok": self.ok,
            "canonical_sha256": self.canonical_sha256,
            "checks": [asdict(c) for c in self.checks],
        }


_ABSENT = "(absent)"


# --------------------------------------------------------------------------- target facts


@dataclass(frozen=True)
class TargetShape:
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    source: str


def target_shape(profile: Profile, target_dir: Path | None) -> TargetShape:
    """The target's layer count, hidden size and vocabulary: from its config.json when given
    (multimodal configs nest them under text_config), else from the profile's target facts."""
    if target_dir is not None:
        _, config = read_config(Path(target_dir))
        text = config.get("text_config", config)
        try:
            return TargetShape(
                int(text["num_hidden_layers"]),
                int(text["hidden_size"]),
                int(text["vocab_size"]),
                f"{Path(target_dir) / CONFIG_NAME}",
            )
        except KeyError as exc:
            raise ConfigFileError(f"{target_dir}/{CONFIG_NAME}: field {exc.args[0]} is missing") from None
    facts = profile.target.facts
    unresolved = [n for n in ("num_hidden_layers", "hidden_size", "vocab_size") if not getattr(facts, n).resolved]
    if unresolved:
        raise UnresolvedPinError(
            f"profile {profile.name}: target.facts {', '.join(unresolved)} unresolved",
            hint="pass --target TARGET_DIR (the target's downloaded config.json) or pin the facts",
        )
    return TargetShape(
        facts.num_hidden_layers.value,
        facts.hidden_size.value,
        facts.vocab_size.value,
        f"profile {profile.name} target.facts",
    )


# --------------------------------------------------------------------------- checks


def _field_checks(profile: Profile, config: dict[str, Any]) -> list[Check]:
    assert profile.drafter is not None and profile.drafter.config is not None
    checks = []
    for name, pin in profile.drafter.config.expected.items():
        consequence = dflash_fields.FIELDS[name].consequence
        where, found = dflash_fields.find(config, name)
        label = where or name
        if not pin.resolved:
            checks.append(Check(label, "(unresolved)", found, False, f"cannot verify: {pin.source}"))
        elif where is None:
            checks.append(Check(name, pin.value, _ABSENT, False, consequence))
        else:
            checks.append(Check(label, pin.value, found, _same(pin.value, found), consequence))
    return checks


def _is_dflash(profile: Profile, config: dict[str, Any]) -> bool:
    return profile.engine.speculative.method == "dflash" or any(
        a in dflash_fields.KNOWN_ARCHITECTURES for a in config.get("architectures", []) or []
    )


def _structure_checks(profile: Profile, config: dict[str, Any], target: TargetShape) -> list[Check]:
    """Checks that hold for any correct drafter of this target, whatever the profile pins."""
    if not _is_dflash(profile, config):
        _, vocab = dflash_fields.find(config, "vocab_size")
        return [
            Check(
                "vocab_size",
                f"== target vocab_size {target.vocab_size}",
                vocab if vocab is not None else _ABSENT,
                vocab == target.vocab_size,
                "draft and target disagree on token ids; every draft is rejected",
                "structure",
            )
        ]
    checks: list[Check] = []

    def add(logical: str, where: str | None, expected: str, found: Any, ok: bool, consequence: str = "") -> None:
        """One structure row, labelled by where the field was found (or its logical name)."""
        text = consequence or dflash_fields.FIELDS[logical].consequence
        checks.append(Check(where or logical, expected, found if where else _ABSENT, ok, text, "structure"))

    where, archs = dflash_fields.find(config, "architectures")
    add(
        "architectures", where,
        f"one of {sorted(dflash_fields.KNOWN_ARCHITECTURES)}",
        archs,
        isinstance(archs, list) and len(archs) == 1 and archs[0] in dflash_fields.KNOWN_ARCHITECTURES,
    )  # fmt: skip

    where, ids = dflash_fields.find(config, "target_layer_ids")
    add(
        "target_layer_ids", where,
        f"distinct ints in [0, {target.num_hidden_layers}) ({target.source})",
        ids,
        isinstance(ids, list)
        and len(ids) > 0
        and all(isinstance(i, int) and 0 <= i < target.num_hidden_layers for i in ids)
        and len(set(ids)) == len(ids),
    )  # fmt: skip

    where, mask = dflash_fields.find(config, "mask_token_id")
    add(
        "mask_token_id", where,
        f"int in [0, {target.vocab_size}) ({target.source})",
        mask,
        isinstance(mask, int) and 0 <= mask < target.vocab_size,
    )  # fmt: skip

    _, layers = dflash_fields.find(config, "num_hidden_layers")
    where, layer_types = dflash_fields.find(config, "layer_types")
    add(
        "layer_types", where,
        f"{layers} entries (num_hidden_layers), each one of {sorted(dflash_fields.KNOWN_LAYER_TYPES)}",
        layer_types,
        isinstance(layer_types, list)
        and isinstance(layers, int)
        and len(layer_types) == layers
        and all(t in dflash_fields.KNOWN_LAYER_TYPES for t in layer_types),
    )  # fmt: skip

    if isinstance(layer_types, list) and "sliding_attention" in layer_types:
        where, window = dflash_fields.find(config, "sliding_window")
        add(
            "sliding_window", where,
            "a positive window (sliding_window or dflash_config.swa_window_size) since a layer slides",
            window,
            isinstance(window, int) and window > 0,
        )  # fmt: skip

    where, block = dflash_fields.find(config, "block_size")
    k = profile.engine.speculative.num_speculative_tokens
    add(
        "block_size", where,
        f"present, >= num_speculative_tokens + 1 = {k + 1}",
        block,
        isinstance(block, int) and k <= block - 1,
        f"vLLM drafts at most block_size - 1 tokens; the profile asks for {k}",
    )  # fmt: skip

    where, hidden = dflash_fields.find(config, "hidden_size")
    add(
        "hidden_size", where,
        f"== target hidden_size {target.hidden_size} ({target.source})",
        hidden,
        hidden == target.hidden_size,
    )  # fmt: skip
    return checks


def _hash_check(profile: Profile, config: dict[str, Any], lock: Lock | None) -> Check | None:
    assert profile.drafter is not None and profile.drafter.config is not None
    pin = profile.drafter.config.canonical_sha256
    found = canonical_sha256(config)
    recorded_content = None
    if pin.resolved:
        expected, origin = pin.value.removeprefix("sha256:"), f"profile {profile.name}"
    elif lock is not None and (entry := lock.get(profile.name, LOCK_KEY)) is not None:
        expected, origin = entry["value"], f"lock {lock.path}"
        recorded_content = entry.get("detail", {}).get("content")
    else:
        return None
    ok = expected == found
    consequence = "" if ok else f"the file differs from the one verified and recorded in the {origin}"
    if not ok and recorded_content is not None:
        consequence += f"; fields that differ: {', '.join(differing_fields(recorded_content, config))}"
    return Check("(whole file, canonical sha256)", expected, found, ok, consequence, "hash")


def verify(
    config_path: Path,
    profile: Profile,
    *,
    target_dir: Path | None = None,
    lock: Lock | None = None,
) -> Report:
    """Verify a drafter config.json: pinned fields, structure against the target, whole-file hash."""
    if profile.drafter is None or profile.drafter.config is None:
        raise SpecdeployError(
            f"profile {profile.name} has no drafter config to verify "
            f"(speculative method {profile.engine.speculative.method!r})"
        )
    _, config = read_config(config_path)
    report = Report(str(config_path), profile.name, canonical_sha256=canonical_sha256(config))
    report.checks += _field_checks(profile, config)
    report.checks += _structure_checks(profile, config, target_shape(profile, target_dir))
    hash_check = _hash_check(profile, config, lock)
    if hash_check is not None:
        report.checks.append(hash_check)
    return report


# --------------------------------------------------------------------------- write-config


@dataclass
class WriteResult:
    serving_dir: str
    config_changed: bool
    links_changed: list[str]
    links_removed: list[str]
    canonical_sha256: str
    lock_recorded: bool
    report: Report


def _refuse_unresolved(profile: Profile) -> None:
    assert profile.drafter is not None and profile.drafter.config is not None
    missing = [f"drafter.config.expected.{n}" for n, p in profile.drafter.config.expected.items() if not p.resolved]
    if missing:
        raise UnresolvedPinError(
            f"profile {profile.name}: refusing to write a config whose content is unresolved: " + ", ".join(missing),
            hint="pin each field's value (with its provenance) in the profile; specdeploy never guesses",
        )


def _sync_links(serving: Path, source: Path) -> tuple[list[str], list[str]]:
    """Point one symlink per source file (weights, tokenizer, ...) into the serving dir."""
    changed, removed = [], []
    wanted = {
        p.name: p.resolve()
        for p in source.iterdir()
        if p.is_file() and p.name != CONFIG_NAME and not p.name.startswith(".")
    }
    for name, target in sorted(wanted.items()):
        link = serving / name
        if link.is_symlink() and Path(link.readlink()) == target:
            continue
        if link.exists() and not link.is_symlink():
            raise WriteError(
                f"{link} is a regular file, not a link to the verified download",
                hint="the serving directory holds only config.json and links; move the file away",
            )
        atomic.symlink(link, target)
        changed.append(name)
    for entry in serving.iterdir():
        if entry.is_symlink() and entry.name not in wanted:
            entry.unlink()
            removed.append(entry.name)
    return changed, removed


def _read_back(serving: Path, raw: bytes) -> None:
    """Prove the write landed: re-read from disk and compare bytes, then check every link."""
    on_disk = (serving / CONFIG_NAME).read_bytes()
    if on_disk != raw:
        raise WriteError(
            f"{serving / CONFIG_NAME} does not hold what was just written "
            f"(sha256 {hashlib.sha256(on_disk).hexdigest()[:12]} != {hashlib.sha256(raw).hexdigest()[:12]})",
            hint="something else writes this path or the mount is not what it seems; "
            "check `findmnt` and other writers before serving",
        )
    for link in serving.iterdir():
        if link.is_symlink() and not link.exists():
            raise WriteError(f"{link} points at {link.readlink()}, which does not exist")


def write_serving_dir(
    serving_dir: Path,
    profile: Profile,
    *,
    source_dir: Path,
    lock: Lock,
    target_dir: Path | None = None,
    keeper: Keeper | None = None,
) -> WriteResult:
    """Create or repair the serving directory from a verified download.

    Order matters: verify first (nothing is written for a bad config), then record the
    hash on first use, then write atomically, then read back. A failure at any point
    leaves the previous config.json untouched.
    """
    if profile.drafter is None or profile.drafter.config is None:
        raise SpecdeployError(f"profile {profile.name} has no drafter config to write")
    _refuse_unresolved(profile)
    source_dir, serving_dir = Path(source_dir), Path(serving_dir)
    if source_dir.resolve() == serving_dir.resolve():
        raise WriteError(
            f"serving directory {serving_dir} is the download itself",
            hint="serve from a separate directory; downloads are never edited in place",
        )
    raw, config = read_config(source_dir)
    report = verify(source_dir / CONFIG_NAME, profile, target_dir=target_dir, lock=lock)
    if not report.ok:
        raise VerificationFailed(report)
    digest = report.canonical_sha256
    recorded = False
    if not profile.drafter.config.canonical_sha256.resolved:
        recorded = lock.record(profile.name, LOCK_KEY, digest, by="write-config", detail={"content": config})

    staged = keeper.stage(serving_dir) if keeper else None  # the running engine's copy, for a rollback
    atomic.ensure_dir(serving_dir)
    current = serving_dir / CONFIG_NAME
    changed = not (current.is_file() and not current.is_symlink() and current.read_bytes() == raw)
    if changed:
        if current.is_symlink():
            current.unlink()
        atomic.write_bytes(current, raw)
    links_changed, links_removed = _sync_links(serving_dir, source_dir)
    if staged and (changed or links_changed or links_removed):
        staged.commit()
    elif staged:
        staged.discard()
    _read_back(serving_dir, raw)
    final = verify(current, profile, target_dir=target_dir, lock=lock)
    if not final.ok:
        raise VerificationFailed(final)
    return WriteResult(str(serving_dir), changed, links_changed, links_removed, digest, recorded, final)


class VerificationFailed(SpecdeployError):
    """verify-config found mismatches; carries the report so callers can print the table."""

    exit_code = 1

    def __init__(self, report: Report) -> None:
        self.report = report
        names = ", ".join(c.field for c in report.failures)
        super().__init__(
            f"{report.path}: drafter config does not verify against profile {report.profile}: {names}",
            hint="fetch the drafter at the pinned revision; never hand-edit config.json",
        )
