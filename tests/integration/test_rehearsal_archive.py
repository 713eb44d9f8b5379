"""The rehearsal's weights archive: the fixture models as `<org>/<name>`, the layout the
play's archive source copies to a host. Uses the real cached fixture models."""

from __future__ import annotations

import json
from pathlib import Path

from specdeploy.profile import load_profile
from specdeploy.rehearsal import archive, variants


def test_export_lays_out_each_repository_without_cache_bookkeeping(tmp_path: Path) -> None:
    exported = archive.export(tmp_path)
    base = load_profile(variants.BASE)
    dflash = variants.dflash(base).drafter
    assert base.drafter is not None and dflash is not None
    assert set(exported) == {base.target.repo, base.drafter.repo, dflash.repo}
    for repo, copy in exported.items():
        assert copy == tmp_path / repo
        assert json.loads((copy / "config.json").read_text())  # a model repository, readable
        assert not {f.name for f in copy.iterdir()} & set(archive.CACHE_FILES)


def test_re_export_replaces_a_stale_copy_and_leaves_no_temporaries(tmp_path: Path) -> None:
    first = archive.export(tmp_path)
    repo, copy = next(iter(first.items()))
    (copy / "stale.bin").write_bytes(b"left over from an older fixture")
    (copy / "config.json").write_text("{}")

    archive.export(tmp_path)

    assert not (copy / "stale.bin").exists()
    assert json.loads((copy / "config.json").read_text()) != {}
    org = tmp_path / repo.split("/")[0]
    assert [p.name for p in org.iterdir() if p.name.startswith(".")] == []
