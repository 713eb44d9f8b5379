"""Bad input to the site's lock commands (`specdeploy lock update|check|merge|show|diff`): a site
lock or a host lock that is not a lock, a host lock on standard input that is not base64, an
entry to re-resolve that the lock does not hold, two sources for the host's lock. Each is a
clear error (exit 2) naming the file or option, with a fix, and the site's lock unchanged."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.badinput import ROOT, Run, Snapshot, write

PROFILE = ROOT / "profiles" / "cpu-rehearsal.yaml"
GOOD = '{"schema_version": 1, "profiles": {}}'
NOT_LOCKS = {
    "not-json": ("{not json", "not valid JSON"),
    "a-list": ("[1]", "the top level"),
    "pins-a-list": ('{"schema_version": 1, "profiles": {}, "pins": []}', "field pins"),
    "superseded-values-a-string": (
        '{"schema_version": 1, "profiles": {}, "superseded": {"p": {"k": "v"}}}',
        "superseded.p.k",
    ),
}


@pytest.mark.parametrize("case", list(NOT_LOCKS), ids=list(NOT_LOCKS))
@pytest.mark.parametrize("command", ["update", "check", "show"])
def test_a_site_lock_that_is_not_a_lock_is_refused_unchanged(
    run: Run, tmp_path: Path, snapshot: Callable[..., Snapshot], case: str, command: str
) -> None:
    content, name = NOT_LOCKS[case]
    lock = write(tmp_path / "specdeploy.lock", content)
    before = snapshot(lock)
    args = ["lock", command, "--lock", lock] + ([] if command == "show" else ["--profile", PROFILE])
    run(*args).expect(2, "lock file", str(lock), name, fix="restore the lock")
    before.unchanged()


@pytest.mark.parametrize("case", list(NOT_LOCKS), ids=list(NOT_LOCKS))
def test_a_host_lock_that_is_not_a_lock_is_refused_by_check_and_merge(
    run: Run, tmp_path: Path, snapshot: Callable[..., Snapshot], case: str
) -> None:
    content, name = NOT_LOCKS[case]
    site = write(tmp_path / "site" / "specdeploy.lock", GOOD)
    host = write(tmp_path / "host.lock", content)
    before = snapshot(site)
    run("lock", "merge", "--lock", site, "--host-lock", host).expect(2, str(host), name, fix="restore the lock")
    encoded = base64.b64encode(content.encode()).decode()
    answer = run(
        "lock", "check", "--lock", site, "--profile", PROFILE, "--host-stdin", "--host", "gpu-01", input=encoded
    )
    answer.expect(2, "host gpu-01", name, fix="restore the lock")
    before.unchanged()


def test_a_host_lock_on_stdin_that_is_not_base64_is_refused(
    run: Run, tmp_path: Path, snapshot: Callable[..., Snapshot]
) -> None:
    site = write(tmp_path / "specdeploy.lock", GOOD)
    before = snapshot(site)
    answer = run("lock", "merge", "--lock", site, "--host-stdin", "--host", "gpu-01", input=GOOD)
    answer.expect(2, "gpu-01", "expected base64", fix="--host-lock FILE")
    before.unchanged()


def test_update_of_an_entry_the_lock_does_not_hold_is_refused(
    run: Run, tmp_path: Path, snapshot: Callable[..., Snapshot]
) -> None:
    site = write(tmp_path / "specdeploy.lock", GOOD)
    before = snapshot(site)
    answer = run("lock", "update", "--profile", PROFILE, "--lock", site, "--key", "engine.image.idd")
    answer.expect(2, "--key engine.image.idd", "no such entry", fix="name a recorded entry")
    before.unchanged()


def test_two_sources_for_the_host_lock_are_a_usage_error(run: Run, tmp_path: Path) -> None:
    site = write(tmp_path / "specdeploy.lock", GOOD)
    host = write(tmp_path / "host.lock", GOOD)
    answer = run("lock", "merge", "--lock", site, "--host-lock", host, "--host-stdin", input="")
    answer.expect(2, "--host-lock and --host-stdin", fix="pass one of them")
    run("lock", "merge", "--lock", site).expect(2, "needs the host's lock", fix="pass the host's lock")
