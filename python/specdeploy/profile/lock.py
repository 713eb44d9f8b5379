"""The lock file: values that could not be known when the profile was written.

A gated file's hash, an image digest, a merge-base are `unresolved` in the profile. The
stage that first fetches or builds one records it here (trust on first verified use), and
every later run, mirror and migration must match it — a drift is an error, never a silent
update. The file is JSON, written atomically, one section per profile.

A revision's files entry (`<role>.files@<revision>`: relative path -> sha256) is named and checked
here once (`files_key`, `files_entry_fault`, `recorded_files`): the weights' fetch and store and the
migration's seed read it through `recorded_files`, and the document check below uses the same rule
(issue 37: the fetch and the store each had a copy, the store through the fetch's private helpers).

A lock that is not one (tried as a hostile environment would: a list, an object without its
keys, bytes that are not UTF-8, a file cut short, a FIFO, a directory) is refused when it is
opened, before any stage runs, as a `LockFileError` (exit 2) naming the file, the entry and
what was found: the whole document's shape is checked here, so no stage meets a malformed
entry later (a KeyError or a TypeError deep in a fetch).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files
from specdeploy.core.errors import InputFileError, LockFileError, LockMismatchError, SpecdeployError, UnresolvedPinError
from specdeploy.profile.schema import Profile, iter_pins

LOCK_SCHEMA = 1


def default_lock_path() -> Path:
    return Path(os.environ.get("SPECDEPLOY_LOCK", "specdeploy.lock"))


class Lock:
    """A lock file on disk. Reads are cheap; every `record` rewrites the file atomically."""

    def __init__(self, path: Path | str, *, data: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.data = self._read() if data is None else data

    @classmethod
    def from_bytes(cls, raw: bytes, origin: str) -> Lock:
        """A lock read from bytes handed over by someone else (a host's lock, read by the
        controller: site_lock): the same checks as a file, `origin` naming it in messages. It
        is never written (its path is `origin`)."""
        return cls(origin, data=cls._parse(raw, origin))

    def _read(self) -> dict[str, Any]:
        if "\0" in str(self.path):
            raise LockFileError(f"lock file {str(self.path)!r}: a path cannot hold a NUL character", hint=_PATH_HINT)
        try:
            os.stat(self.path)
        except FileNotFoundError:
            return {"schema_version": LOCK_SCHEMA, "profiles": {}}  # a new lock: the first record creates it
        except OSError:
            pass  # read_bytes names what is wrong with the path
        try:
            raw = files.read_bytes(self.path, what="lock file", limit=files.LIMITS["json"], hint=_PATH_HINT)
        except InputFileError as exc:  # not a file, too large, unreadable: the path is wrong
            raise LockFileError(f"{exc.message}; nothing was read from it or recorded in it", hint=exc.hint) from None
        return self._parse(raw, self.path)

    @staticmethod
    def _parse(raw: bytes, origin: Path | str) -> dict[str, Any]:
        if len(raw) > files.LIMITS["json"]:
            raise LockFileError(
                f"lock file {origin}: {len(raw)} bytes, over the ceiling of {files.LIMITS['json']}; "
                "nothing was read from it or recorded in it",
                hint=_RESTORE,
            )
        try:
            data = files.parse_json(files.decode(raw, origin, what="lock file"), str(origin), what="lock file")
        except InputFileError as exc:  # the right file, damaged: restore it
            raise LockFileError(f"{exc.message}; nothing was read from it or recorded in it", hint=_RESTORE) from None
        except ValueError as exc:  # JSON that Python will not hold, e.g. a number of 5000 digits
            raise LockFileError(
                f"lock file {origin} is not usable JSON: {exc}; nothing was read from it or recorded in it",
                hint=_RESTORE,
            ) from None
        try:  # every string must survive the next atomic rewrite (UTF-8): a lone "\ud800" escape does not
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LockFileError(
                f"lock file {origin} holds text that is not valid Unicode ({exc.object[exc.start : exc.end]!r}, "
                "a lone surrogate escape); the lock was not used",
                hint=_RESTORE,
            ) from None
        check_shape(data, origin)
        return data

    def get(self, profile: str, key: str) -> dict[str, Any] | None:
        return self.data["profiles"].get(profile, {}).get(key)

    def value(self, profile: str, key: str) -> Any:
        entry = self.get(profile, key)
        return None if entry is None else entry["value"]

    def record(self, profile: str, key: str, value: Any, *, by: str, detail: Any = None) -> bool:
        """Record `value` for `key`; return True if new. A different recorded value is an error."""
        existing = self.get(profile, key)
        if existing is not None:
            if existing["value"] != value:
                raise LockMismatchError(
                    f"{key} for profile {profile}: the lock {self.path} recorded "
                    f"{existing['value']!r} ({existing['recorded_by']}, {existing['recorded_at']}), "
                    f"found {value!r}",
                    hint="the upstream artifact changed since it was verified; investigate before "
                    "deploying, and only then remove the entry from the lock to re-verify",
                )
            return False
        entry = {
            "value": value,
            "recorded_by": by,
            "recorded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        if detail is not None:
            entry["detail"] = detail
        self.data["profiles"].setdefault(profile, {})[key] = entry
        self.save()
        return True

    def text(self) -> str:
        """The lock as it is written: one serialisation, so the controller's copy and a host's
        copy of the same lock are byte-identical (the play's push changes nothing then)."""
        return json.dumps(self.data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def save(self) -> None:
        """Write the whole lock atomically (core.atomic)."""
        atomic.ensure_dir(self.path.parent if str(self.path.parent) else Path("."))
        atomic.write_bytes(self.path, self.text().encode("utf-8"))


_RESTORE = (
    "restore the lock from version control or the host's state directory (it holds values verified at first "
    "fetch or build); delete it only to re-verify every value from scratch"
)
_PATH_HINT = "pass --lock the path of a lock file (JSON), or leave it out to use $SPECDEPLOY_LOCK or ./specdeploy.lock"

# What each kind of entry holds (the stages that record them: weights.fetch/store, images,
# drafter.serving). A value of another shape would reach a stage as a TypeError.
FILES_KEY = re.compile(r"\.files@")  # {path: sha256} of one revision's files (files_key)
_STRING_KEYS = re.compile(
    r"^(engine\.image\.(base\.digest|digest|id)|engine\.source\.(merge_base|commit)|"
    r"(target|drafter)\.revision|drafter\.config\.canonical_sha256)$"
)


_MISSING = object()


def _kind(value: Any) -> str:
    """What was found, for a message: a scalar as its JSON-ish repr, a container by its kind."""
    if value is _MISSING:
        return "nothing (the key is missing)"
    if isinstance(value, dict | list):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)} item(s)"
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:55] + "..."


def check_shape(data: Any, path: Path | str) -> None:
    """Refuse, naming the entry, a lock document that is not `{"schema_version": 1,
    "profiles": {PROFILE: {KEY: {"value": ..., "recorded_by": str, "recorded_at": str,
    "detail"?: {...}}}}, "pins"?: {PROFILE: {"values": {...}, "updated_by": str, "updated_at":
    str}}, "superseded"?: {PROFILE: {KEY: [value, ...]}}}` with each KEY's value of its kind."""

    def bad(where: str, expected: str, found: Any) -> LockFileError:
        return LockFileError(
            f"lock file {path}: {where}: expected {expected}, found {_kind(found)}; the lock was not used",
            hint=_RESTORE,
        )

    if not isinstance(data, dict):
        raise bad("the top level", 'an object {"schema_version": 1, "profiles": {...}}', data)
    version = data.get("schema_version", _MISSING)
    if type(version) is not int or version != LOCK_SCHEMA:
        raise LockFileError(
            f"lock file {path}: field schema_version: expected {LOCK_SCHEMA}, found {_kind(version)}; "
            "the lock was not used",
            hint="a lock of another schema version comes from another specdeploy: use that one, "
            "or restore this profile's lock from version control"
            if type(version) is int
            else _RESTORE,
        )
    profiles = data.get("profiles", _MISSING)
    if not isinstance(profiles, dict):
        raise bad("field profiles", "an object of profile sections", profiles)
    for name, section in profiles.items():
        if not isinstance(section, dict):
            raise bad(f"profiles.{name}", "an object of recorded values", section)
        for key, entry in section.items():
            where = f"profiles.{name}.{key}"
            if not isinstance(entry, dict):
                raise bad(where, 'an object {"value": ..., "recorded_by": ..., "recorded_at": ...}', entry)
            if entry.get("value") is None:
                raise bad(f"{where}.value", "the recorded value", entry.get("value", _MISSING))
            for field in ("recorded_by", "recorded_at"):
                if not isinstance(entry.get(field), str):
                    raise bad(f"{where}.{field}", "a string", entry.get(field, _MISSING))
            if "detail" in entry and not isinstance(entry["detail"], dict):
                raise bad(f"{where}.detail", "an object", entry["detail"])
            value = entry["value"]
            if FILES_KEY.search(key):
                fault = files_entry_fault(value)
                if fault is not None:
                    raise bad(f"{where}.value{fault[0]}", fault[1], fault[2])
            elif _STRING_KEYS.match(key) and not (isinstance(value, str) and value):
                raise bad(f"{where}.value", "a non-empty string", value)
            content = entry.get("detail", {}).get("content")
            if content is not None and not isinstance(content, dict):
                raise bad(f"{where}.detail.content", "an object (the config.json recorded)", content)
    # The controller's sections (profile.site_lock): the pins each profile's entries were made
    # for, and the values a deliberate pin bump (`lock update`) superseded.
    pins = data.get("pins", {})
    if not isinstance(pins, dict):
        raise bad("field pins", "an object of profile pin snapshots", pins)
    for name, snapshot in pins.items():
        where = f"pins.{name}"
        if not isinstance(snapshot, dict) or not isinstance(snapshot.get("values"), dict):
            raise bad(
                f"{where}.values",
                "an object {pin: value}",
                (snapshot or {}).get("values", _MISSING) if isinstance(snapshot, dict) else snapshot,
            )
        for field in ("updated_by", "updated_at"):
            if not isinstance(snapshot.get(field), str):
                raise bad(f"{where}.{field}", "a string", snapshot.get(field, _MISSING))
    superseded = data.get("superseded", {})
    if not isinstance(superseded, dict):
        raise bad("field superseded", "an object of profile sections", superseded)
    for name, section in superseded.items():
        if not isinstance(section, dict):
            raise bad(f"superseded.{name}", "an object {key: [values]}", section)
        for key, values in section.items():
            if not isinstance(values, list):
                raise bad(f"superseded.{name}.{key}", "a list of superseded values", values)


def files_key(role: str, revision: str) -> str:
    """The lock entry holding a revision's per-file sha256 (recorded at its first verified use)."""
    return f"{role}.files@{revision}"


def files_entry_fault(value: Any) -> tuple[str, str, Any] | None:
    """What is wrong with the value of a files entry (`files_key`), as (where below the value,
    what was expected, what was found); None for an object of file name -> sha256 (strings)."""
    if not isinstance(value, dict):
        return "", "an object {file: sha256}", value
    for file, digest in value.items():
        if not isinstance(file, str) or not isinstance(digest, str):
            return f".{file}", "a sha256 string", digest
    return None


def recorded_files(
    lock: Lock, profile_name: str, role: str, revision: str, *, consequence: str
) -> dict[str, str] | None:
    """The lock's entry of a revision's files (relative name -> sha256), None when none is recorded;
    an entry of another shape is refused (InputFileError, exit 2), naming it and `consequence`."""
    key = files_key(role, revision)
    recorded = lock.value(profile_name, key)
    fault = None if recorded is None else files_entry_fault(recorded)
    if fault is not None:
        where, expected, found = fault
        raise InputFileError(
            f"lock {lock.path}: entry {key} of profile {profile_name}{where}: expected {expected}, "
            f"found {_kind(found)}; {consequence}",
            hint="restore the lock from version control (it records the hashes verified at the first fetch)",
        )
    return recorded


def require(profile: Profile, path: str, lock: Lock | None) -> Any:
    """The value a stage must use for pin `path`: the profile's if resolved, else the lock's.

    A pin that is unresolved in both is refused here, naming the pin and where its value
    will come from — stages call this instead of falling back to a default or a guess.
    """
    pins = dict(iter_pins(profile))
    if path not in pins:
        raise SpecdeployError(f"profile {profile.name} has no pin {path!r}")
    pin = pins[path]
    if pin.resolved:
        return pin.value
    recorded = lock.value(profile.name, path) if lock is not None else None
    if recorded is not None:
        return recorded
    where = f"the lock {lock.path}" if lock is not None else "any lock"
    raise UnresolvedPinError(
        f"profile {profile.name}: {path} is unresolved in the profile and in {where}",
        hint=f"its value comes from: {pin.source}",
    )
