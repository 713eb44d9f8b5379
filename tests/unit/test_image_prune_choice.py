"""Which engine images go after a verified deploy (images.prune): the selection as a pure function,
the images the unit and the rollback record name (written by the real keeper and unit install),
and the gate's pass recording what went. podman itself is a recording stand-in here; the real
podman path is tests/integration/test_image_prune.py."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from specdeploy.core import layout
from specdeploy.core.keeper import Keeper, close_run
from specdeploy.engine import units
from specdeploy.gate import run as gate
from specdeploy.images import prune
from specdeploy.images.prune import LocalImage
from specdeploy.profile import resolve_profile_path

REPO = "specdeploy/vllm"
DIGEST = "sha256:" + "d" * 64
UNIT = "specdeploy-engine.container"


@pytest.mark.parametrize(
    "name",
    [
        "specdeploy/vllm",
        "localhost/specdeploy/vllm:0.11.0",
        "registry.site:5000/specdeploy/vllm:0.11.0",
        f"registry.site:5000/specdeploy/vllm@{DIGEST}",
        f"localhost/specdeploy/vllm@{DIGEST}",
    ],
)
def test_a_name_under_any_registry_tag_or_digest_is_of_its_repository(name: str) -> None:
    assert prune.name_repository(name) == REPO


def test_only_images_whose_every_name_is_of_the_repository_and_that_nothing_keeps_are_removable() -> None:
    current = LocalImage("a" * 64, ("localhost/specdeploy/vllm:0.12.0",))
    previous = LocalImage("b" * 64, ("localhost/specdeploy/vllm:0.11.0",), (f"registry.site/specdeploy/vllm@{DIGEST}",))
    old = LocalImage("c" * 64, ("localhost/specdeploy/vllm:0.10.0",), (f"registry.site/specdeploy/vllm@{DIGEST}",))
    pulled = LocalImage("e" * 64, (), (f"registry.site:5000/specdeploy/vllm@{DIGEST}",))
    base = LocalImage("f" * 64, ("docker.io/vllm/vllm-openai:v0.11.0",))
    shared = LocalImage("1" * 64, ("localhost/specdeploy/vllm:old", "localhost/other/tool:1"))
    untagged = LocalImage("2" * 64, ())
    similar = LocalImage("3" * 64, ("localhost/specdeploy/vllm-cpu:1", "localhost/specdeploy/vllm2:1"))
    images = [current, previous, old, pulled, base, shared, untagged, similar]

    keep = {"sha256:" + "a" * 64, "b" * 64}  # with or without podman's "sha256:" prefix
    assert prune.removable(REPO, images, keep) == [old, pulled]


def test_a_quadlet_names_the_image_it_runs_on_its_image_line() -> None:
    text = f"# Managed by specdeploy\n[Container]\nImage=localhost/{REPO}@{DIGEST}\nContainerName=x\n"
    assert prune.unit_images(text) == [f"localhost/{REPO}@{DIGEST}"]
    assert prune.unit_images("[Container]\nContainerName=x\n# Image=commented\n") == []


def test_the_rollback_names_the_image_of_the_unit_the_keeper_kept_even_after_the_run_passed(tmp_path: Path) -> None:
    unit_dir = tmp_path / "systemd"
    old, new = f"localhost/{REPO}@sha256:{'1' * 64}", f"localhost/{REPO}@sha256:{'2' * 64}"
    units.install(units.RenderedUnit(UNIT, f"[Container]\nImage={old}\n"), unit_dir)  # the first deploy
    keeper = Keeper(tmp_path / "rollback", "run-2")
    units.install(units.RenderedUnit(UNIT, f"[Container]\nImage={new}\n"), unit_dir, keeper)

    assert prune.rollback_images(tmp_path / "rollback") == [old]
    close_run(tmp_path / "rollback", "run-2", "verified")  # the copy stays until the next run
    assert prune.rollback_images(tmp_path / "rollback") == [old]
    assert prune.rollback_images(tmp_path / "nothing-kept") == []


FAKE_PODMAN = """#!{python}
# podman as far as the prune uses it, over a JSON state file; every call is logged
import json, sys
from pathlib import Path
here = Path(__file__).parent
state = json.loads((here / "state.json").read_text())
args = sys.argv[1:]
with open(here / "calls.log", "a") as log:
    log.write(" ".join(args) + "\\n")
if args[:2] == ["image", "exists"]:
    sys.exit(0 if args[2] in state["refs"] else 1)
if args[:2] == ["image", "inspect"]:
    print(state["refs"][args[-1]])
elif args[0] == "images":
    print(json.dumps(state["images"]))
elif args[0] == "rmi":
    if any(name in state.get("in_use", []) for name in args[1:]):
        print("Error: image is in use by a container", file=sys.stderr)
        sys.exit(2)
"""


def _fake_podman(directory: Path, images: list[dict[str, Any]], refs: dict[str, str], **extra: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "state.json").write_text(json.dumps({"images": images, "refs": refs, **extra}))
    podman = directory / "podman"
    podman.write_text(FAKE_PODMAN.format(python=sys.executable))
    podman.chmod(0o755)
    return podman


def _calls(podman: Path) -> list[str]:
    log = podman.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_nothing_is_removed_when_the_unit_names_no_image_and_the_report_says_why(tmp_path: Path) -> None:
    podman = _fake_podman(tmp_path / "bin", [{"Id": "c" * 64, "Names": [f"localhost/{REPO}:1"]}], {})
    done = prune.prune(
        f"localhost/{REPO}", unit_file=tmp_path / UNIT, rollback=tmp_path / "rollback", podman=str(podman)
    )
    assert done.removed == [] and _calls(podman) == []
    assert done.lines() == [
        f"not pruned: no image of localhost/{REPO} was removed: expected the engine unit {tmp_path / UNIT} to "
        "name the image it runs (Image=), found no unit: which image the engine runs is unknown"
    ]


def test_a_podman_that_cannot_run_is_reported_not_raised(tmp_path: Path) -> None:
    (tmp_path / UNIT).write_text(f"[Container]\nImage=localhost/{REPO}@{DIGEST}\n")
    done = prune.prune(
        f"localhost/{REPO}", unit_file=tmp_path / UNIT, rollback=tmp_path / "rollback", podman="/nonexistent/podman"
    )
    assert done.removed == []
    assert len(done.problems) == 1 and "--podman /nonexistent/podman" in done.problems[0]
    assert done.problems[0].startswith(f"no image of localhost/{REPO} was removed: ")


def test_an_image_podman_refuses_to_remove_stays_and_the_others_still_go(tmp_path: Path) -> None:
    (tmp_path / UNIT).write_text(f"[Container]\nImage=localhost/{REPO}@{DIGEST}\n")
    images = [
        {"Id": "a" * 64, "Names": [f"localhost/{REPO}:3"]},
        {"Id": "b" * 64, "Names": [f"localhost/{REPO}:2"]},
        {"Id": "c" * 64, "Names": [f"localhost/{REPO}:1", f"registry.site/{REPO}:1"]},
    ]
    podman = _fake_podman(
        tmp_path / "bin", images, {f"localhost/{REPO}@{DIGEST}": "a" * 64}, in_use=[f"localhost/{REPO}:2"]
    )
    done = prune.prune(
        f"localhost/{REPO}", unit_file=tmp_path / UNIT, rollback=tmp_path / "rollback", podman=str(podman)
    )
    assert done.removed == [f"localhost/{REPO}:1, registry.site/{REPO}:1 ({'c' * 12})"]
    assert done.problems == [
        f"localhost/{REPO}:2 ({'b' * 12}) stays: `podman rmi localhost/{REPO}:2` failed (exit 2): "
        "Error: image is in use by a container"
    ]
    assert f"rmi localhost/{REPO}:1 registry.site/{REPO}:1" in _calls(podman)  # every tag at once, never --force


def _gate_passes(tmp_path: Path, profile: str, podman: Path, monkeypatch: pytest.MonkeyPatch) -> gate.GateReport:
    passed = types.SimpleNamespace(verdict=types.SimpleNamespace(value="pass"), to_json=lambda: {"verdict": "pass"})
    monkeypatch.setattr(gate.smoke, "run", lambda *args, **kwargs: passed)
    options = gate.GateOptions(
        endpoint="http://127.0.0.1:9", api_key="k", podman=str(podman), unit_file=tmp_path / "systemd" / UNIT
    )
    host = layout.HostLayout(models=tmp_path / "models", serving=tmp_path / "serving", state=tmp_path / "state")
    return gate.run_gate(resolve_profile_path(profile), host, "run-1", options)


def test_a_passing_gate_of_a_container_profile_removes_the_old_engine_images_and_reports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "localhost/specdeploy-rehearsal/vllm-cpu"  # the profile's engine.image.name
    units.install(units.RenderedUnit(UNIT, f"[Container]\nImage={name}@{DIGEST}\n"), tmp_path / "systemd")
    images = [
        {"Id": "a" * 64, "Names": [f"{name}:0.32.0"]},
        {"Id": "c" * 64, "Names": [f"{name}:0.31.0"]},
        {"Id": "f" * 64, "Names": ["localhost/specdeploy-rehearsal/engine-base:bookworm"]},
    ]
    podman = _fake_podman(tmp_path / "bin", images, {f"{name}@{DIGEST}": "a" * 64})

    report = _gate_passes(tmp_path, "cpu-rehearsal-container", podman, monkeypatch)
    assert report.verdict is gate.Verdict.passed and report.exit_code == 0
    assert report.images_pruned == [f"{name}:0.31.0 ({'c' * 12})"]
    assert [c for c in _calls(podman) if c.startswith("rmi")] == [f"rmi {name}:0.31.0"]
    written = json.loads(report.path.read_text())
    assert written["images_pruned"] == report.images_pruned and written["verdict"] == "pass"


def test_a_passing_gate_of_a_venv_profile_leaves_images_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    podman = _fake_podman(tmp_path / "bin", [], {})
    report = _gate_passes(tmp_path, "cpu-rehearsal", podman, monkeypatch)
    assert report.verdict is gate.Verdict.passed and report.images_pruned is None and _calls(podman) == []
