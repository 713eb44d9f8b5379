"""The build's reproducibility settings, without podman: the fixed timestamp, the OCI format and
the pipe refusal that replaces the SHELL `pipefail` OCI ignores (GPU-host blocker 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.core.errors import UsageError
from specdeploy.images import build as images
from specdeploy.profile import load_profile


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Containerfile"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "run",
    [
        'RUN ["/bin/bash", "-o", "pipefail", "-c", "false | true"]',
        "RUN test -e /x || mkdir /x",
        "RUN echo 'a | b' > /f && echo \"c | d\"",
        "RUN --mount=type=bind,source=a,target=/a ls /a",
    ],
)
def test_runs_without_a_shell_pipe_pass(tmp_path: Path, run: str) -> None:
    images.require_no_pipes(_file(tmp_path, f"FROM x\n# a | comment\n{run}\n"))


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("FROM x\nRUN false | true\n", 2),
        ("FROM x\nRUN a \\\n && find / -name x \\\n    | xargs rm\n", 2),
        ("FROM x\nRUN --mount=type=cache,target=/c curl x | sh\n", 2),
    ],
)
def test_a_shell_form_run_with_a_pipe_is_refused_naming_its_line(tmp_path: Path, text: str, line: int) -> None:
    with pytest.raises(images.ImageError, match=rf"Containerfile:{line}: a shell-form RUN with a pipe") as caught:
        images.require_no_pipes(_file(tmp_path, text))
    assert "pipefail" in caught.value.hint


def test_images_are_built_as_oci_at_the_source_date_not_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert images.source_date_epoch() == 1700000000
    profile = load_profile("cpu-rehearsal-container")
    args = images.build_args(profile, base_digest="sha256:" + "0" * 64, merge_base=None)
    assert args["SOURCE_DATE_EPOCH"] == "1700000000"
    assert args["IMAGE_CREATED"] == "2023-11-14T22:13:20+00:00"
    argv = images.build_argv(profile, args, context=Path("/ctx"), podman="podman")
    assert argv[argv.index("--format") + 1] == "oci" and argv[argv.index("--timestamp") + 1] == "1700000000"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert images.source_date_epoch() == images.DEFAULT_SOURCE_DATE_EPOCH


def test_a_source_date_that_is_no_epoch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(UsageError, match="SOURCE_DATE_EPOCH is 'yesterday'"):
        images.source_date_epoch()


def test_no_containerfile_of_the_repository_runs_a_pipe_that_oci_would_not_fail() -> None:
    root = Path(__file__).resolve().parents[2]
    found = [*root.glob("Containerfile*"), *root.glob("python/**/Containerfile*"), *root.glob("tests/data/**/Contai*")]
    assert len(found) >= 5
    for containerfile in found:
        if containerfile.name != "Containerfile.pipefail":  # the one that must be refused
            images.require_no_pipes(containerfile)


@pytest.mark.parametrize(
    ("name", "registry"),
    [
        ("10.89.64.11:5000/specdeploy-rehearsal/vllm-cpu", "10.89.64.11:5000"),
        ("registry.example.org/ml/vllm", "registry.example.org"),
        ("docker.io/vllm/vllm-openai", "docker.io"),
        ("localhost/specdeploy-rehearsal/vllm-cpu", None),
        ("vllm/vllm-openai", None),
        ("busybox", None),
    ],
)
def test_the_registry_an_image_name_names_is_read_as_podman_reads_it(name: str, registry: str | None) -> None:
    from specdeploy.core.references import registry_of

    assert registry_of(name) == registry
