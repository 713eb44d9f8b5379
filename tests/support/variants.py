"""Profile variants only the tests need (the shared ones live in specdeploy.rehearsal.variants)."""

from __future__ import annotations

from specdeploy.profile import Profile
from specdeploy.rehearsal.variants import derive


def engine_version(base: Profile, version: str) -> Profile:
    """The profile pinning another engine version: what a host with the wrong build looks like."""
    pin = {"value": version, "provenance": "rehearsal", "source": "test variant: a different engine version"}
    return derive(base, f"{base.name}-v{version.replace('.', '-')}", {"engine": {"source": {"version": pin}}})
