"""The rollback keeper and restore on real files. systemctl is recorded here; the real
systemd path (restart, smoke of the restored stack) runs in the rehearsal deploy test."""

from __future__ import annotations

from pathlib import Path

from specdeploy.core import layout
from specdeploy.core.keeper import Keeper, OpenRunError, close_run, load_run
from specdeploy.engine import units
from specdeploy.rollback import restore as rollback


def _serving(root: Path, text: str) -> Path:
    d = root / "serving" / "drafter"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(text)
    link = d / "model.safetensors"
    if not link.is_symlink():
        link.symlink_to(root / "weights.bin")
    return d


def test_restore_puts_back_exactly_what_the_run_replaced(tmp_path: Path) -> None:
    unit = tmp_path / "etc" / "specdeploy-engine.service"
    unit.parent.mkdir()
    unit.write_text("old unit\n")
    serving = _serving(tmp_path, '{"old": true}')
    keeper = Keeper(tmp_path / "rollback", "run-2")

    staged = keeper.stage(serving)
    (serving / "config.json").write_text('{"new": true}')
    staged.commit()
    assert units.install(units.RenderedUnit(unit.name, "new unit\n"), unit.parent, keeper)
    again = keeper.stage(serving)  # a second change in the same run: the first copy wins
    (serving / "config.json").write_text('{"newer": true}')
    again.commit()

    calls: list[list[str]] = []
    done = rollback.restore(tmp_path / "rollback", "run-2", unit="specdeploy-engine", run=calls.append)
    assert unit.read_text() == "old unit\n"
    assert (serving / "config.json").read_text() == '{"old": true}'
    assert (serving / "model.safetensors").is_symlink()  # links come back as links
    assert calls == [["daemon-reload"], ["reset-failed", "specdeploy-engine"], ["restart", "specdeploy-engine"]]
    assert done.unit_action == "restarted" and set(done.restored) == {str(serving), str(unit)}
    failed = sorted((tmp_path / "rollback" / "failed").iterdir())
    assert any((f / "config.json").is_file() and "newer" in (f / "config.json").read_text() for f in failed)


def test_an_unchanged_step_keeps_nothing_and_another_run_restores_nothing(tmp_path: Path) -> None:
    serving = _serving(tmp_path, "{}")
    keeper = Keeper(tmp_path / "rollback", "run-1")
    keeper.stage(serving).discard()
    assert load_run(tmp_path / "rollback") is None
    staged = keeper.stage(serving)
    staged.commit()
    calls: list[list[str]] = []
    other = rollback.restore(tmp_path / "rollback", "run-9", unit="specdeploy-engine", run=calls.append)
    assert not other.anything and calls == []
    # a new run discards the copies of a run that ended (here: its gate passed)
    assert close_run(tmp_path / "rollback", "run-1", "verified")
    Keeper(tmp_path / "rollback", "run-10").stage(serving).commit()
    record = load_run(tmp_path / "rollback")
    assert record is not None and record.run_id == "run-10" and len(record.entries) == 1


def test_a_run_that_never_ended_keeps_its_copies_until_it_is_recovered(tmp_path: Path) -> None:
    """GPU-host blocker 9: a run interrupted after replacing the serving directory (no gate,
    no restore) had its copies — the last good stack — discarded by the next run's first
    replacement. Now the next run's keeper refuses before touching anything, `open_run` names
    the interrupted run, and once it is restored the next run may go on."""
    serving = _serving(tmp_path, '{"good": true}')
    rollback_dir = tmp_path / "rollback"
    state = layout.HostLayout(state=tmp_path)
    staged = Keeper(rollback_dir, "interrupted").stage(serving)
    (serving / "config.json").write_text('{"ungated": true}')
    staged.commit()  # ... and the controller died here

    assert rollback.open_run(state, "next") == "interrupted"
    assert rollback.open_run(state, "interrupted") is None  # a run is not its own leftover
    try:
        Keeper(rollback_dir, "next").stage(serving)
        raise AssertionError("the next run's keeper must refuse while the interrupted run is open")
    except OpenRunError as exc:
        assert "interrupted" in exc.message and "rollback recover" in (exc.hint or "")
    assert (serving / "config.json").read_text() == '{"ungated": true}'  # the refusal changed nothing

    calls: list[list[str]] = []
    done = rollback.restore(rollback_dir, "interrupted", unit="specdeploy-engine", run=calls.append)
    assert done.anything and (serving / "config.json").read_text() == '{"good": true}'
    assert rollback.open_run(state, "next") is None
    again = rollback.restore(rollback_dir, "interrupted", unit="specdeploy-engine", run=calls.append)
    assert not again.anything  # restoring twice puts nothing back twice (the rescue after a gate's own)
    Keeper(rollback_dir, "next").stage(serving).commit()


def test_a_run_whose_gate_passed_is_never_restored_by_a_later_failure(tmp_path: Path) -> None:
    """The play's rescue restores its run after any failure, even one after a passing gate (a
    task after the gate, an error while pruning): a run closed as verified must stay deployed."""
    serving = _serving(tmp_path, '{"old": true}')
    staged = Keeper(tmp_path / "rollback", "passed").stage(serving)
    (serving / "config.json").write_text('{"new": true}')
    staged.commit()
    assert close_run(tmp_path / "rollback", "passed", "verified")
    calls: list[list[str]] = []
    done = rollback.restore(tmp_path / "rollback", "passed", unit="specdeploy-engine", run=calls.append)
    assert not done.anything and calls == [] and (serving / "config.json").read_text() == '{"new": true}'


def test_a_first_deploy_that_fails_removes_its_unit_and_stops_the_engine(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path / "rollback", "first")
    units.install(units.RenderedUnit("specdeploy-engine.service", "unit\n"), tmp_path, keeper)
    calls: list[list[str]] = []
    done = rollback.restore(tmp_path / "rollback", "first", unit="specdeploy-engine", run=calls.append)
    assert not (tmp_path / "specdeploy-engine.service").exists()
    assert done.unit_action == "stopped" and calls[-1] == ["stop", "specdeploy-engine"]


def test_the_unit_names_the_profile_copy_it_was_rendered_from(tmp_path: Path) -> None:
    from specdeploy.profile import load_profile, resolve_profile_path

    copy = units.keep_profile_copy(resolve_profile_path("cpu-rehearsal"), layout.HostLayout(state=tmp_path))
    assert copy.name == "cpu-rehearsal.yaml" and load_profile(copy).name == "cpu-rehearsal"
    unit = units.render(load_profile("cpu-rehearsal"), profile_file=str(copy))
    assert layout.unit_profile_file(unit.text) == str(copy)
