"""`specdeploy image manifest`'s reading of an image's files, on tar streams made here: what it
compares (content, type, mode, owner, link targets) and what it does not (times; the EXCLUDED paths)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from specdeploy.core.errors import InputFileError
from specdeploy.images import manifest


def _tar(entries: list[tuple[str, bytes | str | None, int, int]]) -> io.BytesIO:
    """(path, content bytes | link target | None for a directory, mode, mtime) -> a tar stream."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, content, mode, mtime in entries:
            info = tarfile.TarInfo(path)
            info.mode, info.mtime = mode, mtime
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return buffer


BASE = [("opt", None, 0o755, 1), ("opt/a.py", b"print(1)\n", 0o644, 1), ("usr/bin/python3", "python3.11", 0o777, 1)]


def test_two_builds_that_differ_only_in_file_times_have_equal_manifests() -> None:
    later = [(p, c, m, 1_700_000_000) for p, c, m, _ in BASE]
    assert manifest.compare(manifest.from_tar(_tar(BASE)), manifest.from_tar(_tar(later))) == []


@pytest.mark.parametrize(
    ("changed", "what"),
    [
        (("opt/a.py", b"print(2)\n", 0o644, 1), "content"),
        (("opt/a.py", b"print(1)\n", 0o755, 1), "mode"),
        (("usr/bin/python3", "python3.13", 0o777, 1), "link target"),
    ],
)
def test_a_file_that_differs_in_content_mode_or_link_target_is_named(changed: tuple, what: str) -> None:
    other = [changed if entry[0] == changed[0] else entry for entry in BASE]
    differences = manifest.compare(manifest.from_tar(_tar(BASE)), manifest.from_tar(_tar(other)))
    assert [d.path for d in differences] == [changed[0]], what


def test_a_file_on_one_side_only_is_named_and_excluded_paths_are_left_out() -> None:
    extra = [*BASE, ("opt/b.py", b"", 0o644, 1), ("etc/hosts", b"", 0o700, 1)]
    found = manifest.from_tar(_tar(extra))
    assert "etc/hosts" not in found and set(manifest.EXCLUDED) == {"etc/hosts"}
    differences = manifest.compare(manifest.from_tar(_tar(BASE)), found)
    assert [(d.path, d.left) for d in differences] == [("opt/b.py", None)]


def test_a_manifest_written_with_another_exclusion_list_is_refused(tmp_path: Path) -> None:
    written = manifest.Manifest("img", "sha256:" + "0" * 64, manifest.from_tar(_tar(BASE)))
    path = tmp_path / "m.json"
    manifest.write(written, path)
    assert manifest.load(path).files == written.files
    data = json.loads(path.read_text())
    data["excluded"] = {}
    path.write_text(json.dumps(data))
    with pytest.raises(InputFileError, match="another exclusion list"):
        manifest.load(path)
