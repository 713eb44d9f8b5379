"""The engine image archive's cache key (engine_image.archive_key): a kept image is loaded by
the container rehearsal instead of being built again, so a key that missed one of the build's
inputs would serve a stale engine. Each input changes the key; nothing else does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specdeploy.core import layout
from specdeploy.profile import load_profile
from specdeploy.profile.facts import deploy_facts
from specdeploy.rehearsal import deploy, engine_image, variants

PROFILE = load_profile(deploy.PROFILE)


@pytest.fixture
def context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the build context the images role ships, and a stand-in base image ID (the real
    base is debootstrapped by the integration tests)."""
    root = deploy.checkout()
    facts = deploy_facts(PROFILE, layout.HostLayout(), layout.InstallLayout())
    for name in facts["image"]["context_files"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / name, tmp_path / name)
    monkeypatch.setattr(engine_image, "base_image", lambda profile: profile.engine.image.base.name)
    monkeypatch.setattr(engine_image.images, "local_id", lambda name, podman: "a" * 64)
    return tmp_path


def test_the_key_changes_with_each_build_input_and_only_with_those(
    context: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = tmp_path / "wheelhouse-0123456789ab"
    key = engine_image.archive_key(PROFILE, context=context, wheels=wheels)
    assert engine_image.archive_key(PROFILE, context=context, wheels=wheels) == key
    assert engine_image.engine_archive(PROFILE, key).name == f"engine-{PROFILE.name}-{key}.tar"
    # another wheelhouse (its pins changed)
    assert engine_image.archive_key(PROFILE, context=context, wheels=tmp_path / "wheelhouse-ba9876543210") != key
    # another build arg in the profile's image
    assert PROFILE.engine.image is not None
    bumped = variants.derive(PROFILE, PROFILE.name, {"engine": {"image": {"build_args": {"EXTRA": "1"}}}})
    assert engine_image.archive_key(bumped, context=context, wheels=wheels) != key
    # what the build does not read leaves the key alone: the smoke's thresholds, the serve flags
    other = variants.derive(
        PROFILE, PROFILE.name, {"smoke": {"position0_acceptance_min": 0.5}, "engine": {"serve": {"max_model_len": 384}}}
    )
    assert engine_image.archive_key(other, context=context, wheels=wheels) == key
    # a changed file of the build context
    containerfile = context / PROFILE.engine.image.containerfile
    containerfile.write_text(containerfile.read_text() + "\n# changed\n")
    changed = engine_image.archive_key(PROFILE, context=context, wheels=wheels)
    assert changed != key
    # another base image
    monkeypatch.setattr(engine_image.images, "local_id", lambda name, podman: "b" * 64)
    assert engine_image.archive_key(PROFILE, context=context, wheels=wheels) != changed
