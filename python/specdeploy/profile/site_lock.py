"""The site's lock is the controller's: one lock per site, kept beside the inventory.

Failures prevented: (1) hosts that trust on first use independently — two hosts of one site
recording different values for one pin (a drafter config that changed upstream between their
first deploys) and nobody noticing; (2) a deliberate pin bump (a new drafter revision, a new
engine version) failing as a LockMismatchError on every host until someone edits each host's
lock by hand; (3) a lock nobody can review, because it only ever lived on the hosts.

The flow (ansible/roles/specdeploy/tasks/lock.yml and lock_back.yml, `specdeploy lock ...`):

1. `lock check` (on the controller, before any stage): the profile's pins must be those the
   site's lock was last updated for (its `pins` snapshot; the first deploy of a profile takes
   the snapshot), else PinsChangedError: "run `specdeploy lock update`". Then the host's lock
   (read from the host) is compared with the site's, entry by entry, by the **divergence rule**:

   - the host lacks an entry the site has: accepted (the push gives it to the host);
   - the host holds an entry the site lacks: accepted and dropped — the push replaces the
     host's lock, so this deploy resolves the value again from its source (fetch, build,
     write-config) and the fetch-back records it: no host value enters the site's lock
     without a passing gate;
   - both hold the entry with the same value: accepted;
   - the host's value is one the site's lock lists as superseded for that key (`lock update`
     moved it there: the host still holds the pins before the bump): accepted, replaced;
   - any other difference is a LockDivergenceError naming the profile, the key, the host's
     value and the site's value, and the fix. Nothing is deployed to the host.

2. The play copies the site's lock to the host (root's, 0644: the engine user cannot write
   it). The stages record there what the site's lock lacks, as before.

3. After the host's gate passed, `lock merge` reads the host's lock back and adds its new
   entries to the site's lock (verbatim, so both copies stay byte-identical), atomically; an
   entry whose value differs from the site's is refused, naming it, and nothing is merged.
   The play then copies the merged lock back to the host. The second host receives the values
   the first resolved, and its stages must match them (LockMismatchError otherwise).

`lock update --profile NAME` is the pin-bump flow: it compares the profile's pins with the
snapshot, lists the recorded entries they make stale (STALE_WHEN below), moves those entries'
values to `superseded` and takes the new snapshot. The next deploy resolves the new values
through the gate and the fetch-back records them. Entries keyed per revision
(`target.files@REV`, `drafter.files@REV`) are never stale: another revision is another key.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core.errors import LockDivergenceError, LockFileError, LockMismatchError, PinsChangedError
from specdeploy.profile.lock import FILES_KEY, Lock
from specdeploy.profile.schema import Pin, Profile

# The pins a lock entry depends on (prefixes of pin_snapshot's names: "engine." is every
# engine pin there). A change of any of them makes the entry stale. One table: `lock update`
# reads it, docs/ansible.md prints it.
STALE_WHEN: dict[str, tuple[str, ...]] = {
    "engine.image.id": ("engine.",),
    "engine.image.digest": ("engine.",),
    "engine.image.base.digest": ("engine.image.base.",),
    "engine.source.commit": ("engine.source.git_repo", "engine.source.git_ref", "engine.source.commit"),
    "engine.source.merge_base": (
        "engine.source.git_repo",
        "engine.source.git_ref",
        "engine.source.commit",
        "engine.source.merge_base",
    ),  # fmt: skip
    "target.revision": ("target.repo", "target.revision"),
    "drafter.revision": ("drafter.repo", "drafter.revision"),
    "drafter.config.canonical_sha256": ("drafter.",),
}


def _pin(pin: Pin | None) -> Any:
    return pin.value if pin is not None and pin.resolved else None


def pin_snapshot(profile: Profile) -> dict[str, Any]:
    """The pins the lock's entries are made from, by name: the engine's identity (not its
    serve flags: they change no recorded value), the models' repos and revisions, the
    drafter's config pins. A value `None` is an unresolved pin."""
    engine, source = profile.engine, profile.engine.source
    snap: dict[str, Any] = {
        "engine.kind": engine.kind,
        "engine.runtime": engine.runtime,
        "engine.source.git_repo": source.git_repo,
        "engine.source.git_ref": source.git_ref,
        "engine.source.commit": _pin(source.commit),
        "engine.source.merge_base": _pin(source.merge_base),
        "engine.source.package": source.package,
        "engine.source.version": _pin(source.version),
    }
    if engine.image is not None:
        image = engine.image
        snap |= {
            "engine.image.name": image.name,
            "engine.image.containerfile": image.containerfile,
            "engine.image.base.name": image.base.name,
            "engine.image.base.digest": _pin(image.base.digest),
            "engine.image.digest": _pin(image.digest),
            "engine.image.build_args": dict(sorted(image.build_args.items())),
            "engine.image.engine_wheels": image.engine_wheels,
        }
    snap |= {"target.repo": profile.target.repo, "target.revision": _pin(profile.target.revision)}
    if profile.drafter is not None:
        snap |= {"drafter.repo": profile.drafter.repo, "drafter.revision": _pin(profile.drafter.revision)}
        if profile.drafter.config is not None:
            expected = profile.drafter.config.expected
            snap |= {f"drafter.config.expected.{name}": _pin(expected[name]) for name in sorted(expected)}
            snap["drafter.config.canonical_sha256"] = _pin(profile.drafter.config.canonical_sha256)
    return snap


def stale_because(key: str, changed: list[str]) -> list[str]:
    """The changed pins that make lock entry `key` stale (empty: it stays)."""
    if FILES_KEY.search(key):  # {file: sha256} of one revision (lock.files_key): never stale
        return []
    deps = STALE_WHEN.get(key)
    if deps is None:  # a key no rule names: stale on any change, never silently kept
        return list(changed)
    return [item for item in changed if any(item == d or (d.endswith(".") and item.startswith(d)) for d in deps)]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 90 else text[:80] + "..."


def _update_hint(profile: str, site: Path) -> str:
    return f"run `specdeploy lock update --profile {profile} --lock {site}`, review and commit the lock, then deploy"


def _superseded(site: Lock, profile: str, key: str) -> list[Any]:
    return site.data.get("superseded", {}).get(profile, {}).get(key, [])


# --------------------------------------------------------------------------- the pins snapshot


@dataclass
class PinChange:
    pin: str
    locked: Any  # the value the lock was updated for (None: unresolved, or no snapshot)
    profile: Any


def changed_pins(site: Lock, profile: Profile) -> list[PinChange] | None:
    """The pins that differ from the site lock's snapshot for this profile; None when the lock
    has no snapshot for it (never deployed, or a lock from before snapshots)."""
    snapshot = site.data.get("pins", {}).get(profile.name)
    if snapshot is None:
        return None
    locked, now = snapshot["values"], pin_snapshot(profile)
    return [PinChange(pin, locked.get(pin), now.get(pin)) for pin in sorted(set(locked) | set(now)) if
            locked.get(pin) != now.get(pin)]  # fmt: skip


def _take_snapshot(site: Lock, profile: Profile, *, by: str) -> None:
    site.data.setdefault("pins", {})[profile.name] = {
        "values": pin_snapshot(profile),
        "updated_by": by,
        "updated_at": _now(),
    }


# --------------------------------------------------------------------------- lock check


@dataclass
class HostCheck:
    site_lock: str
    host: str
    exists: bool  # the site's lock is on disk (the play pushes it)
    written: bool  # this check took the profile's first pins snapshot
    lacks: list[str] = field(default_factory=list)  # PROFILE/KEY the host lacks: pushed
    superseded: list[str] = field(default_factory=list)  # host values `lock update` superseded: replaced
    dropped: list[str] = field(default_factory=list)  # host-only entries: resolved again by this deploy

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def read_host_lock(*, path: Path | None, stdin_base64: str | None, host: str) -> Lock | None:
    """The host's lock: from a file (by hand), or base64 on standard input (what Ansible's
    slurp gives); None when neither (the host has none)."""
    if path is not None:
        return Lock.from_bytes(Path(path).read_bytes(), f"{path} (host {host})") if Path(path).exists() else None
    if stdin_base64 is None:
        return None
    try:
        raw = base64.b64decode(stdin_base64.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise LockFileError(
            f"the lock of host {host} on standard input: expected base64 (what ansible.builtin.slurp reads), "
            f"found {_shown(stdin_base64[:40])}; nothing was checked",
            hint="pass the host's lock with --host-lock FILE, or its base64 on standard input with --host-stdin",
        ) from None
    return Lock.from_bytes(raw, f"the lock of host {host}")


def check_host(site: Lock, host_lock: Lock | None, profile: Profile, *, host: str, write: bool = True) -> HostCheck:
    """Refuse a deploy whose profile pins moved without `lock update`, or a host whose lock
    diverges from the site's (the rule in the module docstring); take the profile's first
    snapshot when the site's lock has none (written unless `write` is False: --check)."""
    changes = changed_pins(site, profile)
    if changes:
        listed = "; ".join(f"{c.pin}: locked for {_shown(c.locked)}, the profile has {_shown(c.profile)}"
                           for c in changes)  # fmt: skip
        raise PinsChangedError(
            f"profile {profile.name}: {len(changes)} pin(s) changed since the site's lock {site.path} was "
            f"updated: {listed}; the entries recorded for the old pins would be refused on every host",
            hint=_update_hint(profile.name, site.path),
        )
    result = HostCheck(str(site.path), host, exists=site.path.is_file(), written=False)
    if host_lock is not None:
        divergent: list[str] = []
        site_sections = site.data["profiles"]
        for name, section in sorted(host_lock.data["profiles"].items()):
            for key, entry in sorted(section.items()):
                mine = site_sections.get(name, {}).get(key)
                where = f"{name}/{key}"
                if mine is None:
                    result.dropped.append(where)
                elif mine["value"] != entry["value"]:
                    if entry["value"] in _superseded(site, name, key):
                        result.superseded.append(where)
                    else:
                        divergent.append(
                            f"{where}: host {_shown(entry['value'])} ({entry['recorded_by']}, {entry['recorded_at']}), "
                            f"site {_shown(mine['value'])} ({mine['recorded_by']}, {mine['recorded_at']})"
                        )
        for name, section in sorted(site_sections.items()):
            result.lacks += [
                f"{name}/{k}" for k in sorted(section) if k not in host_lock.data["profiles"].get(name, {})
            ]
        if divergent:
            raise LockDivergenceError(
                f"host {host}: its lock {host_lock.path} differs from the site's lock {site.path} in "
                f"{len(divergent)} entr{'y' if len(divergent) == 1 else 'ies'}: {'; '.join(divergent)}; "
                "nothing was deployed to it",
                hint="find out which value is right (the host's lock was edited, or written from another lock): "
                "if the site's, remove the host's lock (the deploy pushes the site's); if the host's, the "
                f"upstream artifact changed: investigate, then `specdeploy lock update --profile {profile.name} "
                f"--lock {site.path} --key KEY` to resolve it again, and deploy",
            )
    else:
        result.lacks = [f"{n}/{k}" for n, s in sorted(site.data["profiles"].items()) for k in sorted(s)]
    if site.data.get("pins", {}).get(profile.name) is None:
        _take_snapshot(site, profile, by=f"first deploy (lock check, host {host})")
        if write:
            site.save()
            result.exists = result.written = True
    return result


# --------------------------------------------------------------------------- lock merge


def merge_back(site: Lock, host_lock: Lock, *, host: str) -> list[str]:
    """Add the entries the host resolved (its lock after a passing gate) that the site's lock
    lacks, verbatim; refuse, merging nothing, any entry whose value differs. Returns the
    PROFILE/KEY names added; writes the site's lock atomically when there are any."""
    added: list[str] = []
    conflicts: list[str] = []
    for name, section in sorted(host_lock.data["profiles"].items()):
        for key, entry in sorted(section.items()):
            mine = site.data["profiles"].get(name, {}).get(key)
            if mine is None:
                site.data["profiles"].setdefault(name, {})[key] = entry
                superseded = site.data.get("superseded", {}).get(name, {})
                if entry["value"] in superseded.get(key, []):
                    superseded[key] = [v for v in superseded[key] if v != entry["value"]]
                    if not superseded[key]:
                        del superseded[key]
                added.append(f"{name}/{key}")
            elif mine["value"] != entry["value"]:
                conflicts.append(f"{name}/{key}: host {_shown(entry['value'])}, site {_shown(mine['value'])}")
    if conflicts:
        raise LockMismatchError(
            f"host {host}: its lock {host_lock.path} resolved {len(conflicts)} value(s) that differ from the site's "
            f"lock {site.path}: {'; '.join(conflicts)}; nothing was merged",
            hint="another deploy recorded these values in the site's lock while this one ran, or the host's lock "
            "was edited: compare both with `specdeploy lock diff`, keep the right value, and deploy again",
        )
    if added:
        site.save()
    return added


# --------------------------------------------------------------------------- lock update


@dataclass
class StaleEntry:
    key: str
    value: Any
    because: list[str]


@dataclass
class UpdatePlan:
    profile: str
    lock: str
    first: bool  # the lock had no snapshot for the profile: every pin counts as changed
    changed: list[PinChange]
    stale: list[StaleEntry]
    kept: list[str]

    @property
    def empty(self) -> bool:
        return not self.changed and not self.stale

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "lock": self.lock,
            "first_snapshot": self.first,
            "changed_pins": [c.__dict__ for c in self.changed],
            "stale_entries": [s.__dict__ for s in self.stale],
            "kept_entries": self.kept,
        }


def plan_update(site: Lock, profile: Profile, *, keys: tuple[str, ...] = ()) -> UpdatePlan:
    """What `lock update` changes: the pins that moved since the snapshot (all of them when
    there is none), and the entries they make stale (plus `keys`, re-resolved on request)."""
    changes = changed_pins(site, profile)
    first = changes is None
    if changes is None:
        changes = [PinChange(pin, None, value) for pin, value in pin_snapshot(profile).items()]
    section = site.data["profiles"].get(profile.name, {})
    unknown = [k for k in keys if k not in section]
    if unknown:
        raise LockFileError(
            f"--key {', '.join(unknown)}: no such entry for profile {profile.name} in the lock {site.path}",
            hint=f"name a recorded entry: {', '.join(sorted(section)) or '(none recorded)'}",
        )
    names = [c.pin for c in changes]
    stale, kept = [], []
    for key in sorted(section):
        because = stale_because(key, names) + (["--key"] if key in keys else [])
        if because:
            stale.append(StaleEntry(key, section[key]["value"], because))
        else:
            kept.append(key)
    return UpdatePlan(profile.name, str(site.path), first, changes, stale, kept)


def apply_update(site: Lock, profile: Profile, plan: UpdatePlan) -> None:
    """Move the stale entries' values to `superseded` (hosts that still hold them are accepted
    and given the new values), take the new snapshot, write the lock atomically."""
    section = site.data["profiles"].get(profile.name, {})
    superseded = site.data.setdefault("superseded", {}).setdefault(profile.name, {})
    for entry in plan.stale:
        values = superseded.setdefault(entry.key, [])
        if entry.value not in values:
            values.append(entry.value)
        section.pop(entry.key, None)
    if not superseded:
        del site.data["superseded"][profile.name]
    if not site.data["superseded"]:
        del site.data["superseded"]
    _take_snapshot(site, profile, by="lock update")
    site.save()


# --------------------------------------------------------------------------- lock diff


@dataclass
class EntryDiff:
    profile: str
    key: str
    a: Any  # None: absent on that side
    b: Any


def diff(a: Lock, b: Lock) -> list[EntryDiff]:
    """Every entry whose value differs between two locks, or that only one holds."""
    found = []
    names = sorted(set(a.data["profiles"]) | set(b.data["profiles"]))
    for name in names:
        left, right = a.data["profiles"].get(name, {}), b.data["profiles"].get(name, {})
        for key in sorted(set(left) | set(right)):
            x = left.get(key, {}).get("value")
            y = right.get(key, {}).get("value")
            if x != y:
                found.append(EntryDiff(name, key, x, y))
    return found
