"""The lock file: values that could not be known when the profile was written.

A gated file's hash, an image digest, a merge-base are `unresolved` in the profile. The
stage that first fetches or builds one records it here (trust on first verified use), and
every later run, mirror and migration must match it — a drift is an error, never a silent
update. The file is JSON, written atomically, one section per profile.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from specdeploy.core import atomic
from specdeploy.core.errors import LockMismatchError, SpecdeployError, UnresolvedPinError
from specdeploy.profile.schema import Profile, iter_pins

LOCK_SCHEMA = 1


def default_lock_path() -> Path:
    return Path(os.environ.get("SPECDEPLOY_LOCK", "specdeploy.lock"))


class Lock:
    """A lock file on disk. Reads are cheap; every `record` rewrites the file atomically."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.data = self._read()

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"schema_version": LOCK_SCHEMA, "profiles": {}}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecdeployError(
                f"lock file {self.path} is unreadable: {exc}",
                hint="restore it from version control; it records hashes verified at first fetch",
            ) from None
        if data.get("schema_version") != LOCK_SCHEMA:
            raise SpecdeployError(
                f"lock file {self.path}: field schema_version: expected {LOCK_SCHEMA}, "
                f"found {data.get('schema_version')!r}"
            )
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
        atomic.ensure_dir(self.path.parent if str(self.path.parent) else Path("."))
        atomic.write_json(self.path, self.data, sort_keys=True)
        return True


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
