"""Typed errors with actionable messages.

Every error a user can hit names what was wrong, what was expected, what was found and
what to do — the tone of huggingface_hub's errors. The CLI maps each class to an exit code
(docs/commands.md "Exit codes"); anything that is not a SpecdeployError is a bug in specdeploy and
exits with EXIT_INTERNAL, so a script or the gate can tell a bug from a bad input.
"""

from __future__ import annotations

from typing import Any

EXIT_INTERNAL = 70  # an unexpected exception: a bug in specdeploy (sysexits' EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM before the command finished
# sysexits' EX_TEMPFAIL, "try again later": another deploy holds the host (core.deploylock), or
# `gate-wait --for S` found the gate still running (core.verdicts.EXIT_RUNNING)
EXIT_TEMPFAIL = 75


class SpecdeployError(Exception):
    """Base class: a problem the user can act on (never a bug in specdeploy)."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.hint}" if self.hint else self.message


class ProfileError(SpecdeployError):
    """A deployment profile is missing, unreadable or violates the schema."""

    exit_code = 2


class UsageError(SpecdeployError):
    """Options that cannot go together, or one that is missing: bad input, exit 2."""

    exit_code = 2


class UnresolvedPinError(SpecdeployError):
    """A pin the operation depends on is still `unresolved` in the profile and the lock."""

    exit_code = 1


class ConfigFileError(SpecdeployError):
    """A drafter config.json is missing or not valid JSON (verify-config exits 2)."""

    exit_code = 2


class InputFileError(SpecdeployError):
    """A file given to specdeploy is missing, not a regular file, too large, not UTF-8 or not
    JSON (core.files): bad input, exit 2."""

    exit_code = 2


class WriteError(SpecdeployError):
    """An atomic write could not complete; the previous file is untouched."""

    exit_code = 1


class LockMismatchError(SpecdeployError):
    """A value differs from the one recorded in the lock file at first fetch/build/write."""

    exit_code = 1


class ProgramError(SpecdeployError):
    """A program specdeploy was told to run (`--podman`, ...) is missing, not executable or
    not what it should be: bad input, exit 2 (never a traceback)."""

    exit_code = 2


class LockFileError(SpecdeployError):
    """A lock file that is not one: not a regular file, too large, not UTF-8, not JSON, or
    JSON without the lock's shape (profile.lock). Bad input, exit 2; nothing is recorded."""

    exit_code = 2


class LockDivergenceError(SpecdeployError):
    """A host's lock holds a value the site's lock (on the controller) does not: the host was
    changed outside a deploy, or deployed from another lock (profile.site_lock). Nothing was
    deployed to it."""

    exit_code = 1


class PinsChangedError(SpecdeployError):
    """A profile's pins differ from those the site's lock was made for: a pin bump that did not
    go through `specdeploy lock update` (profile.site_lock). Nothing was deployed."""

    exit_code = 1


def first_invalid(exc: Any) -> str:
    """A pydantic ValidationError's first error as `FIELD: MESSAGE (found VALUE)`: the dotted field
    (or "(top level)"), pydantic's message, and the value found (its repr, at most 80 characters).
    Every loader of a file or an answer names what it refuses the same way."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return f"{where}: {first['msg']} (found {str(repr(first.get('input')))[:80]})"
