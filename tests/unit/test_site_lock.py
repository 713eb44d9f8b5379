"""The site's lock on the controller (profile.site_lock) through the real CLI: `lock update`
shows and applies a pin bump, `lock check` refuses a divergent host lock and accepts one that
only lacks entries or holds superseded values, `lock merge` adds new entries and refuses
conflicts."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.profile import resolve_profile_path
from specdeploy.profile.lock import _STRING_KEYS
from specdeploy.profile.site_lock import STALE_WHEN

PROFILE = "cpu-rehearsal"
OLD_HASH, NEW_HASH = "a" * 64, "b" * 64


def _cli(*args: object, input: str | None = None) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def _entry(value: Any, by: str = "write-config") -> dict[str, Any]:
    return {"value": value, "recorded_by": by, "recorded_at": "2026-01-01T00:00:00+00:00"}


def _profile(tmp_path: Path, *, vocab: int = 640) -> Path:
    """cpu-rehearsal, its drafter's expected vocab_size pinned to `vocab` (a pin bump when changed)."""
    data = yaml.safe_load(resolve_profile_path(PROFILE).read_text())
    data["drafter"]["config"]["expected"]["vocab_size"]["value"] = vocab
    path = tmp_path / "profiles" / f"{PROFILE}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _deployed_site(tmp_path: Path) -> tuple[Path, Path]:
    """A site lock after a first deploy: the snapshot taken by `lock check`, entries merged back."""
    site, profile = tmp_path / "inventory" / "specdeploy.lock", _profile(tmp_path)
    site.parent.mkdir()
    assert _cli("lock", "check", "--lock", site, "--profile", profile, "--json").exit_code == 0
    host = tmp_path / "host.lock"
    data = json.loads(site.read_text())
    data["profiles"] = {
        PROFILE: {
            "drafter.config.canonical_sha256": _entry(OLD_HASH),
            "target.files@sha256-0123": _entry({"config.json": "c" * 64}, by="weights serve"),
        }
    }
    host.write_text(json.dumps(data))
    merged = _cli("lock", "merge", "--lock", site, "--host-lock", host, "--host", "h1", "--json")
    assert merged.exit_code == 0, merged.stderr
    return site, profile


KEYS = (
    "engine.image.id", "engine.image.digest", "engine.image.base.digest", "engine.source.merge_base",
    "engine.source.commit", "target.revision", "drafter.revision", "drafter.config.canonical_sha256",
)  # fmt: skip


def test_every_string_entry_a_stage_records_has_a_staleness_rule() -> None:
    assert all(_STRING_KEYS.match(key) for key in KEYS) and set(KEYS) == set(STALE_WHEN)


def test_update_shows_and_applies_a_pin_bump_and_the_deploy_check_then_accepts_it(tmp_path: Path) -> None:
    site, profile = _deployed_site(tmp_path)
    _profile(tmp_path, vocab=641)  # the bump, in the reviewed profile
    refused = _cli("lock", "check", "--lock", site, "--profile", profile)
    assert refused.exit_code == 1
    assert f"run `specdeploy lock update --profile {PROFILE} --lock {site}`" in refused.stderr
    assert "drafter.config.expected.vocab_size: locked for 640, the profile has 641" in refused.stderr

    before = site.read_bytes()
    shown = _cli("lock", "update", "--profile", profile, "--lock", site, "--dry-run")
    assert shown.exit_code == 0, shown.stderr
    assert "drafter.config.expected" in shown.stdout and "drafter.config.canonical_sha256" in shown.stdout
    assert "nothing written" in shown.stdout
    assert site.read_bytes() == before  # a dry run writes nothing

    done = _cli("lock", "update", "--profile", profile, "--lock", site, "--json")
    assert done.exit_code == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [c["pin"] for c in plan["changed_pins"]] == ["drafter.config.expected.vocab_size"]
    assert [s["key"] for s in plan["stale_entries"]] == ["drafter.config.canonical_sha256"]
    assert plan["kept_entries"] == ["target.files@sha256-0123"] and plan["written"] is True
    lock = json.loads(site.read_text())
    assert lock["superseded"] == {PROFILE: {"drafter.config.canonical_sha256": [OLD_HASH]}}
    assert "drafter.config.canonical_sha256" not in lock["profiles"][PROFILE]
    assert lock["pins"][PROFILE]["values"]["drafter.config.expected.vocab_size"] == 641

    # a host that still holds the superseded value is accepted (the push replaces it)
    host = tmp_path / "host.lock"
    checked = _cli("lock", "check", "--lock", site, "--profile", profile, "--host-lock", host, "--json")
    assert checked.exit_code == 0, checked.stderr
    assert json.loads(checked.stdout)["dropped"] == [f"{PROFILE}/drafter.config.canonical_sha256"]
    # the deploy resolves the new value; the fetch-back records it and clears the superseded one
    data = json.loads(site.read_text())
    data["profiles"][PROFILE]["drafter.config.canonical_sha256"] = _entry(NEW_HASH)
    host.write_text(json.dumps(data))
    merged = _cli("lock", "merge", "--lock", site, "--host-lock", host, "--host", "h1", "--json")
    assert json.loads(merged.stdout)["added"] == [f"{PROFILE}/drafter.config.canonical_sha256"]
    lock = json.loads(site.read_text())
    assert lock["profiles"][PROFILE]["drafter.config.canonical_sha256"]["value"] == NEW_HASH
    assert "superseded" in lock and lock["superseded"][PROFILE]["drafter.config.canonical_sha256"] == [OLD_HASH]
    # a second host, still on the old value while the site holds the new one: superseded, accepted
    again = _cli("lock", "check", "--lock", site, "--profile", profile, "--host-lock", tmp_path / "h2.lock")
    assert again.exit_code == 0
    (tmp_path / "h2.lock").write_text(json.dumps({"schema_version": 1, "profiles": {
        PROFILE: {"drafter.config.canonical_sha256": _entry(OLD_HASH)}}}))  # fmt: skip
    h2 = _cli("lock", "check", "--lock", site, "--profile", profile, "--host-lock", tmp_path / "h2.lock", "--json")
    assert h2.exit_code == 0, h2.stderr
    assert json.loads(h2.stdout)["superseded"] == [f"{PROFILE}/drafter.config.canonical_sha256"]


def test_a_host_lock_with_a_divergent_value_is_refused_naming_key_and_both_values(tmp_path: Path) -> None:
    site, profile = _deployed_site(tmp_path)
    host = tmp_path / "edited.lock"
    host.write_text(json.dumps({"schema_version": 1, "profiles": {
        PROFILE: {"drafter.config.canonical_sha256": _entry("e" * 64, by="someone")}}}))  # fmt: skip
    before = site.read_bytes()
    refused = _cli("lock", "check", "--lock", site, "--profile", profile, "--host-lock", host, "--host", "gpu-02")
    assert refused.exit_code == 1
    err = " ".join(refused.stderr.split())
    assert "host gpu-02" in err and f"{PROFILE}/drafter.config.canonical_sha256" in err
    assert repr("e" * 64) in err and repr(OLD_HASH) in err and "nothing was deployed" in err
    assert "fix:" in err and "remove the host's lock" in err and "Traceback" not in err
    assert site.read_bytes() == before


def test_a_host_lock_that_only_lacks_entries_is_accepted_through_ansibles_base64(tmp_path: Path) -> None:
    site, profile = _deployed_site(tmp_path)
    lacking = json.dumps({"schema_version": 1, "profiles": {PROFILE: {
        "target.files@sha256-0123": _entry({"config.json": "c" * 64}, by="weights serve")}}})  # fmt: skip
    b64 = base64.b64encode(lacking.encode()).decode()
    done = _cli("lock", "check", "--lock", site, "--profile", profile, "--host-stdin", "--json", input=b64)
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["lacks"] == [f"{PROFILE}/drafter.config.canonical_sha256"]


def test_merge_adds_new_entries_and_refuses_a_conflict_merging_nothing(tmp_path: Path) -> None:
    site, _ = _deployed_site(tmp_path)
    host = tmp_path / "h.lock"
    data = json.loads(site.read_text())
    data["profiles"][PROFILE]["engine.image.id"] = _entry("sha256:" + "1" * 64, by="image ensure")
    host.write_text(json.dumps(data))
    added = _cli("lock", "merge", "--lock", site, "--host-lock", host, "--json")
    assert json.loads(added.stdout) | {} == {"site_lock": str(site), "host": "the host",
                                             "added": [f"{PROFILE}/engine.image.id"], "changed": True}  # fmt: skip
    # both copies byte-identical after a merge: the play's push back changes nothing
    again = json.loads(site.read_text())
    assert again["profiles"] == data["profiles"]
    data["profiles"][PROFILE]["engine.image.id"] = _entry("sha256:" + "2" * 64, by="image ensure")
    data["profiles"][PROFILE]["drafter.revision"] = _entry("f" * 40, by="fetch")
    host.write_text(json.dumps(data))
    before = site.read_bytes()
    refused = _cli("lock", "merge", "--lock", site, "--host-lock", host, "--host", "gpu-01")
    assert refused.exit_code == 1
    err = " ".join(refused.stderr.split())
    assert f"{PROFILE}/engine.image.id" in err and "1" * 20 in err and "2" * 20 in err and "nothing was merged" in err
    assert site.read_bytes() == before


def test_diff_names_each_differing_entry_and_exits_1(tmp_path: Path) -> None:
    site, _ = _deployed_site(tmp_path)
    other = tmp_path / "other.lock"
    other.write_text(json.dumps({"schema_version": 1, "profiles": {}}))
    done = _cli("lock", "diff", site, other, "--json")
    assert done.exit_code == 1
    assert {d["key"] for d in json.loads(done.stdout)} == {
        "drafter.config.canonical_sha256",
        "target.files@sha256-0123",
    }
    assert _cli("lock", "diff", site, site).exit_code == 0
    assert "drafter.config.canonical_sha256" in _cli("lock", "show", "--lock", site).stdout
