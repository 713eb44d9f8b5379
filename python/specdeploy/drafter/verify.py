"""Verify a drafter's config.json against the profile and the target: `verify-config`.

The field failure this prevents: a hand-built DFlash config.json with a wrong
mask_token_id, guessed target_layer_ids and no sliding-window fields ran for hours at
acceptance length 1.1 instead of ~3. `verify` names every field that is off, the expected
and found value and what it costs — before anything starts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core.errors import ConfigFileError, SpecdeployError, UnresolvedPinError
from specdeploy.profile import Profile, drafter_fields
from specdeploy.profile.lock import Lock

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
        consequence = drafter_fields.FIELDS[name].consequence
        where, found = drafter_fields.find(config, name)
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
        a in drafter_fields.KNOWN_ARCHITECTURES for a in config.get("architectures", []) or []
    )


def _structure_checks(profile: Profile, config: dict[str, Any], target: TargetShape) -> list[Check]:
    """Checks that hold for any correct drafter of this target, whatever the profile pins."""
    if not _is_dflash(profile, config):
        _, vocab = drafter_fields.find(config, "vocab_size")
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
        text = consequence or drafter_fields.FIELDS[logical].consequence
        checks.append(Check(where or logical, expected, found if where else _ABSENT, ok, text, "structure"))

    where, archs = drafter_fields.find(config, "architectures")
    add(
        "architectures", where,
        f"one of {sorted(drafter_fields.KNOWN_ARCHITECTURES)}",
        archs,
        isinstance(archs, list) and len(archs) == 1 and archs[0] in drafter_fields.KNOWN_ARCHITECTURES,
    )  # fmt: skip

    where, ids = drafter_fields.find(config, "target_layer_ids")
    add(
        "target_layer_ids", where,
        f"distinct ints in [0, {target.num_hidden_layers}) ({target.source})",
        ids,
        isinstance(ids, list)
        and len(ids) > 0
        and all(isinstance(i, int) and 0 <= i < target.num_hidden_layers for i in ids)
        and len(set(ids)) == len(ids),
    )  # fmt: skip

    where, mask = drafter_fields.find(config, "mask_token_id")
    add(
        "mask_token_id", where,
        f"int in [0, {target.vocab_size}) ({target.source})",
        mask,
        isinstance(mask, int) and 0 <= mask < target.vocab_size,
    )  # fmt: skip

    _, layers = drafter_fields.find(config, "num_hidden_layers")
    where, layer_types = drafter_fields.find(config, "layer_types")
    add(
        "layer_types", where,
        f"{layers} entries (num_hidden_layers), each one of {sorted(drafter_fields.KNOWN_LAYER_TYPES)}",
        layer_types,
        isinstance(layer_types, list)
        and isinstance(layers, int)
        and len(layer_types) == layers
        and all(t in drafter_fields.KNOWN_LAYER_TYPES for t in layer_types),
    )  # fmt: skip

    if isinstance(layer_types, list) and "sliding_attention" in layer_types:
        where, window = drafter_fields.find(config, "sliding_window")
        add(
            "sliding_window", where,
            "a positive window (sliding_window or dflash_config.swa_window_size) since a layer slides",
            window,
            isinstance(window, int) and window > 0,
        )  # fmt: skip

    where, block = drafter_fields.find(config, "block_size")
    k = profile.engine.speculative.num_speculative_tokens
    add(
        "block_size", where,
        f"present, >= num_speculative_tokens + 1 = {k + 1}",
        block,
        isinstance(block, int) and k <= block - 1,
        f"vLLM drafts at most block_size - 1 tokens; the profile asks for {k}",
    )  # fmt: skip

    where, hidden = drafter_fields.find(config, "hidden_size")
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
