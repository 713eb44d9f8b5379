"""Verify a drafter's config.json against the profile and the target: `verify-config`.

The field failure this prevents: a hand-built DFlash config.json with a wrong
mask_token_id, guessed target_layer_ids and no sliding-window fields ran for hours at
acceptance length 1.1 instead of ~3. `verify` names every field that is off, the expected
and found value and what it costs — before anything starts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import files
from specdeploy.core.errors import ConfigFileError, InputFileError, SpecdeployError, UnresolvedPinError, UsageError
from specdeploy.profile import Profile, drafter_fields
from specdeploy.profile.lock import Lock

CONFIG_NAME = "config.json"
LOCK_KEY = "drafter.config.canonical_sha256"

DRAFTER = "drafter config"
TARGET = "target config"
FETCH_DRAFTER = "fetch the drafter at the profile's pinned revision first (specdeploy fetch)"
TARGET_OF_DRAFTER = "check that --target (or the profile's target.facts) is the model this drafter was trained for"
FETCH_TARGET = (
    "pass --target the target model's downloaded directory (or its config.json) at the profile's pinned "
    "revision (specdeploy fetch); leave --target out to use the profile's target.facts"
)
# A real config.json nests three or four levels (text_config.rope_parameters...); one nested
# deeper than this is not a model config, and walking it would exhaust the stack.
MAX_DEPTH = 32
# Found values longer than this (as JSON) are shown shortened: a 2.4M-entry layer_types must
# not become a 40 MB table cell.
SHOWN_CHARS = 240


# What to do about a failed check (its `fix`, printed after the table as a `fix:` line)
PINNED_FILE = (
    "use the drafter's own config.json at the profile's pinned revision (specdeploy fetch), never a hand-edited one"
)


def _field_fix(profile_name: str, name: str) -> str:
    return (
        f"{PINNED_FILE}; if that file holds this value, correct drafter.config.expected.{name} in profile "
        f"{profile_name}"
    )


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


def config_file(path: Path | str) -> Path:
    """The config.json a path names: the file itself, or `config.json` in a model directory.

    Resolved once, here, for every reader: a config.json that is itself a directory is reported
    as that path (never `.../config.json/config.json`)."""
    path = Path(path)
    if path.is_dir() and (path.name != CONFIG_NAME or os.path.lexists(path / CONFIG_NAME)):
        return path / CONFIG_NAME
    return path


def _too_deep(data: Any) -> int | None:
    """The nesting depth of `data` when it is over MAX_DEPTH, else None (iterative: no recursion)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return depth
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return None


def read_config(path: Path | str, *, what: str = DRAFTER, hint: str = FETCH_DRAFTER) -> tuple[bytes, dict[str, Any]]:
    """Read and parse a config.json (the file, or a directory holding one): a regular file
    under the JSON ceiling, UTF-8, a JSON object nested at most MAX_DEPTH deep. Anything else
    is an InputFileError (exit 2) naming the file, what was expected and what was found."""
    file = config_file(path)
    raw = files.read_bytes(file, what=what, hint=hint)
    text = files.decode(raw, file, what=what)
    try:
        data = files.parse_json(text, str(file), what=what)
    except InputFileError:
        raise
    except ValueError as exc:  # a number the JSON parser refuses to convert (over 4300 digits)
        raise InputFileError(
            f"{what} {file} is not usable JSON: {' '.join(str(exc).split())[:160]}",
            hint="check that this is the right file (no model config holds such a number)",
        ) from None
    data = files.expect_mapping(data, str(file), what=what)
    depth = _too_deep(data)
    if depth is not None:
        raise InputFileError(
            f"{what} {file} is not usable JSON: nested more than {MAX_DEPTH} levels deep (a model config "
            "nests three or four)",
            hint="check that this is the right file",
        )
    try:
        canonical_bytes(data)
    except UnicodeEncodeError as exc:
        raise InputFileError(
            f"{what} {file} holds a string that is not valid Unicode ({exc.reason}: an unpaired "
            "surrogate escape such as \\ud800)",
            hint=f"fix the {what} (or restore it from where it came from)",
        ) from None
    return raw, data


def shown(value: Any) -> Any:
    """A found value as a report shows it: as it is, or shortened when its JSON is long (a
    hostile list must not become a megabyte table cell); the check itself saw the whole value."""
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= SHOWN_CHARS:
        return value
    size = f"{len(value)} entries, " if isinstance(value, (list, dict)) else ""
    return f"({size}{len(text)} characters) {text[:SHOWN_CHARS]}…"


# --------------------------------------------------------------------------- the report


@dataclass
class Check:
    field: str
    expected: Any
    found: Any
    ok: bool
    consequence: str = ""
    kind: str = "field"  # field | structure | hash
    fix: str = ""  # what to do when the check fails


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


def _brief(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:80] + "…"


def _target_int(text: dict[str, Any], name: str, prefix: str, origin: Path) -> int:
    """A positive integer fact of the target's config.json, or a ConfigFileError (exit 2) naming
    the field, the expected and the found value."""
    value = text.get(name)
    consequence = "the drafter's layers, hidden size and vocabulary cannot be checked against the target"
    if value is None:
        raise ConfigFileError(
            f"{TARGET} {origin}: field {prefix}{name} is missing: {consequence}",
            hint=FETCH_TARGET,
        )
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigFileError(
            f"{TARGET} {origin}: field {prefix}{name}: expected a positive integer, found {_brief(value)} "
            f"({type(value).__name__}): {consequence}",
            hint=FETCH_TARGET,
        )
    return value


def target_shape(profile: Profile, target_dir: Path | None) -> TargetShape:
    """The target's layer count, hidden size and vocabulary: from its config.json when given
    (multimodal configs nest them under text_config; `text_config: null` means none), else from
    the profile's target facts."""
    if target_dir is not None:
        origin = config_file(target_dir)
        _, config = read_config(origin, what=TARGET, hint=FETCH_TARGET)
        text, prefix = config, ""
        nested = config.get("text_config")
        if isinstance(nested, dict):
            text, prefix = nested, "text_config."
        elif nested is not None:
            raise ConfigFileError(
                f"{TARGET} {origin}: field text_config: expected an object (a multimodal model's text "
                f"config) or no field, found {_brief(nested)} ({type(nested).__name__})",
                hint=FETCH_TARGET,
            )
        return TargetShape(
            _target_int(text, "num_hidden_layers", prefix, origin),
            _target_int(text, "hidden_size", prefix, origin),
            _target_int(text, "vocab_size", prefix, origin),
            str(origin),
        )
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
            fix = (
                f"resolve drafter.config.expected.{name} in profile {profile.name}: read it from the drafter's "
                "config.json at the pinned revision"
            )
            checks.append(Check(label, "(unresolved)", shown(found), False, f"cannot verify: {pin.source}", fix=fix))
        elif where is None:
            checks.append(Check(name, pin.value, _ABSENT, False, consequence, fix=_field_fix(profile.name, name)))
        else:
            ok = _same(pin.value, found)
            fix = "" if ok else _field_fix(profile.name, name)
            checks.append(Check(label, pin.value, shown(found), ok, consequence, fix=fix))
    return checks


def _dialect_checks(config: dict[str, Any]) -> list[Check]:
    """A field set in two places (two dialects at once) must hold one value in both: engines
    read different places, so a contradiction runs a value the other checks never saw."""
    checks = []
    for name in drafter_fields.MULTI_PLACE:
        found = drafter_fields.places(config, name)
        if len(found) < 2:
            continue
        ok = not drafter_fields.conflict(config, name)
        where = " and ".join(path for path, _ in found)
        values = ", ".join(f"{path}={json.dumps(shown(value), ensure_ascii=False)}" for path, value in found)
        consequence = (
            ""
            if ok
            else f"set twice with different values: engines read different places, so the drafter runs "
            f"with a {name} the other checks never saw; keep one place (as the upstream file does)"
        )
        fix = "" if ok else f"keep {name} in one place with one value, as the upstream file does: {PINNED_FILE}"
        checks.append(Check(where, f"one value in {where}", values, ok, consequence, "structure", fix))
    return checks


def _int(value: Any) -> bool:
    """A JSON integer (true and false are not numbers here, though Python counts them as ints)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_dflash(profile: Profile, config: dict[str, Any]) -> bool:
    archs = config.get("architectures")
    return profile.engine.speculative.method == "dflash" or (
        isinstance(archs, list) and any(isinstance(a, str) and a in drafter_fields.KNOWN_ARCHITECTURES for a in archs)
    )


def _structure_checks(profile: Profile, config: dict[str, Any], target: TargetShape) -> list[Check]:
    """Checks that hold for any correct drafter of this target, whatever the profile pins."""
    if not _is_dflash(profile, config):
        _, vocab = drafter_fields.find(config, "vocab_size")
        ok = _int(vocab) and vocab == target.vocab_size
        return [
            Check(
                "vocab_size",
                f"== target vocab_size {target.vocab_size}",
                shown(vocab) if vocab is not None else _ABSENT,
                ok,
                "draft and target disagree on token ids; every draft is rejected",
                "structure",
                "" if ok else f"{PINNED_FILE}; {TARGET_OF_DRAFTER}",
            )
        ]
    checks: list[Check] = []

    def add(
        logical: str, where: str | None, expected: str, found: Any, ok: bool, consequence: str = "", fix: str = ""
    ) -> None:
        """One structure row, labelled by where the field was found (or its logical name)."""
        text = consequence or drafter_fields.FIELDS[logical].consequence
        fix = "" if ok else (fix or PINNED_FILE)
        row = Check(where or logical, expected, shown(found) if where else _ABSENT, ok, text, "structure", fix)
        checks.append(row)

    where, archs = drafter_fields.find(config, "architectures")
    add(
        "architectures", where,
        f"one of {sorted(drafter_fields.KNOWN_ARCHITECTURES)}",
        archs,
        isinstance(archs, list)
        and len(archs) == 1
        and isinstance(archs[0], str)
        and archs[0] in drafter_fields.KNOWN_ARCHITECTURES,
    )  # fmt: skip

    where, ids = drafter_fields.find(config, "target_layer_ids")
    add(
        "target_layer_ids", where,
        f"distinct ints in [0, {target.num_hidden_layers}) ({target.source})",
        ids,
        isinstance(ids, list)
        and len(ids) > 0
        and all(_int(i) and 0 <= i < target.num_hidden_layers for i in ids)
        and len(set(ids)) == len(ids),
        fix=f"{PINNED_FILE}; {TARGET_OF_DRAFTER}",
    )  # fmt: skip

    where, mask = drafter_fields.find(config, "mask_token_id")
    add(
        "mask_token_id", where,
        f"int in [0, {target.vocab_size}) ({target.source})",
        mask,
        _int(mask) and 0 <= mask < target.vocab_size,
        fix=f"{PINNED_FILE}; {TARGET_OF_DRAFTER}",
    )  # fmt: skip

    _, layers = drafter_fields.find(config, "num_hidden_layers")
    where, layer_types = drafter_fields.find(config, "layer_types")
    add(
        "layer_types", where,
        f"{layers} entries (num_hidden_layers), each one of {sorted(drafter_fields.KNOWN_LAYER_TYPES)}",
        layer_types,
        isinstance(layer_types, list)
        and _int(layers)
        and len(layer_types) == layers
        and all(isinstance(t, str) and t in drafter_fields.KNOWN_LAYER_TYPES for t in layer_types),
    )  # fmt: skip

    if isinstance(layer_types, list) and "sliding_attention" in layer_types:
        where, window = drafter_fields.find(config, "sliding_window")
        add(
            "sliding_window", where,
            "a positive window (sliding_window or dflash_config.swa_window_size) since a layer slides",
            window,
            _int(window) and window > 0,
        )  # fmt: skip

    where, block = drafter_fields.find(config, "block_size")
    k = profile.engine.speculative.num_speculative_tokens
    add(
        "block_size", where,
        f"present, >= num_speculative_tokens + 1 = {k + 1}",
        block,
        _int(block) and k <= block - 1,
        f"vLLM drafts at most block_size - 1 tokens; the profile asks for {k}",
        f"{PINNED_FILE}; if it holds this block_size, lower engine.speculative.num_speculative_tokens in profile "
        f"{profile.name} to at most block_size - 1",
    )  # fmt: skip

    where, hidden = drafter_fields.find(config, "hidden_size")
    add(
        "hidden_size", where,
        f"== target hidden_size {target.hidden_size} ({target.source})",
        hidden,
        _int(hidden) and hidden == target.hidden_size,
        fix=f"{PINNED_FILE}; {TARGET_OF_DRAFTER}",
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
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), str):
            raise InputFileError(
                f"lock file {lock.path}: profiles.{profile.name}.{LOCK_KEY}: expected an entry with a string "
                f"value (the sha256 recorded at first write), found {_brief(entry)}",
                hint="restore the lock from version control; it records what was verified at first use",
            )
        expected, origin = entry["value"], f"lock {lock.path}"
        detail = entry.get("detail")
        recorded_content = detail.get("content") if isinstance(detail, dict) else None
        if _too_deep(recorded_content) is not None:
            recorded_content = None  # not a config: name no fields rather than walk it
    else:
        return None
    ok = expected == found
    consequence = "" if ok else f"the file differs from the one verified and recorded in the {origin}"
    fix = (
        ""
        if ok
        else f"{PINNED_FILE}, the one recorded in the {origin}; if upstream changed it, investigate before "
        "deploying, and only then re-pin it"
    )
    if not ok and recorded_content is not None:
        names = differing_fields(recorded_content, config)
        more = f" and {len(names) - 20} more" if len(names) > 20 else ""
        consequence += f"; fields that differ: {', '.join(names[:20])}{more}"
    return Check("(whole file, canonical sha256)", expected, found, ok, consequence, "hash", fix)


def verify(
    config_path: Path,
    profile: Profile,
    *,
    target_dir: Path | None = None,
    lock: Lock | None = None,
) -> Report:
    """Verify a drafter config.json: pinned fields, structure against the target, whole-file hash."""
    if profile.drafter is None or profile.drafter.config is None:
        raise UsageError(
            f"profile {profile.name} has no drafter config to verify "
            f"(speculative method {profile.engine.speculative.method!r})",
            hint="pass the profile of a deployment with a drafter (one with a drafter.config section)",
        )
    file = config_file(config_path)
    _, config = read_config(file)
    report = Report(str(file), profile.name, canonical_sha256=canonical_sha256(config))
    report.checks += _field_checks(profile, config)
    report.checks += _dialect_checks(config)
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
