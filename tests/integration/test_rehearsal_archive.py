"""The rehearsal's weights archive: the fixture models as `<org>/<name>/<revision>` with a
manifest of every file's sha256, the layout the play's archive source copies to a host and
verifies there. Uses the real cached fixture models."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specdeploy.core import hashcache
from specdeploy.profile import load_profile
from specdeploy.rehearsal import archive, variants
from specdeploy.weights import store


def test_export_lays_out_each_repository_without_cache_bookkeeping(tmp_path: Path) -> None:
    exported = archive.export(tmp_path)
    base = load_profile(variants.BASE)
    dflash = variants.dflash(base).drafter
    assert base.drafter is not None and dflash is not None
    assert set(exported) == {base.target.repo, base.drafter.repo, dflash.repo}
    manifest = json.loads((tmp_path / store.MANIFEST).read_text())["models"]
    for repo, copy in exported.items():
        assert copy.parent == tmp_path / repo and copy.name.startswith(store.CONTENT_REVISION_PREFIX)
        assert json.loads((copy / "config.json").read_text())  # a model repository, readable
        assert not {f.name for f in copy.iterdir()} & {*archive.CACHE_FILES, hashcache.STATE_DIR}
        assert manifest[repo]["revision"] == copy.name
        assert manifest[repo]["files"] == {
            f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in copy.iterdir() if f.is_file()
        }


def test_re_export_replaces_a_stale_copy_and_leaves_no_temporaries(tmp_path: Path) -> None:
    first = archive.export(tmp_path)
    repo, copy = next(iter(first.items()))
    (copy / "stale.bin").write_bytes(b"left over from an older fixture")
    (copy / "config.json").write_text("{}")

    again = archive.export(tmp_path)

    assert again[repo] == copy  # the fixture's content, so its revision, is the same
    assert not (copy / "stale.bin").exists()
    assert json.loads((copy / "config.json").read_text()) != {}
    assert [p.name for p in (tmp_path / repo).iterdir()] == [copy.name]  # no temporaries, no other revision
