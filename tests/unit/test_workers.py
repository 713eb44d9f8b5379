"""The suite's two workers (tests/support/workers.py): tests that share a session's host, service
or port are one work unit; a unit test is a unit of its own."""

from __future__ import annotations

from pathlib import Path

from tests.support import workers

ROOT = Path(__file__).resolve().parents[2]


def test_each_leader_and_its_follower_share_a_worker_and_every_module_named_exists() -> None:
    pairs = [
        ("test_container_rehearsal.py", "test_migration.py"),
        ("test_deploy_rehearsal.py", "test_watch_rehearsal.py"),
    ]
    for leader, follower in pairs:
        assert workers.group(f"tests/integration/{leader}::test_a") == workers.group(f"tests/integration/{follower}::b")
    assert all((ROOT / "tests" / "integration" / name).is_file() for name in workers.NETWORK)


def test_the_hub_users_run_beside_the_container_rig_and_the_engine_stacks_on_the_other_worker() -> None:
    network = {workers.group(f"tests/integration/{name}::t") for name in workers.NETWORK}
    assert network == {"test-network"}
    assert workers.group("tests/integration/test_smoke_vllm.py::test_x[healthy]") == "engines"


def test_a_unit_or_bad_input_test_is_a_unit_of_its_own() -> None:
    nodeid = "tests/unit/test_front.py::test_x[a@b]"
    assert workers.group(nodeid) == nodeid
    assert workers.group("tests/badinput/test_records.py::test_y") == "tests/badinput/test_records.py::test_y"
