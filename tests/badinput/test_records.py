"""Bad input to the rollback run record and to JSON from outside (issue 20: D2, D7, D14; the review
of its first round).

The rollback run record (`<rollback>/run.json`) is read by one reader, core.keeper.load_run, from
every command that uses it: `unit install`, `write-config` and `weights serve` with
`--rollback-dir`, `rollback restore`, and a passing `gate` (which closes it). Each case damages
the record — truncated, an entry without its keys, a FIFO or a directory where the file goes, a
path no system call takes — and checks what docs/commands.md's bad-input table promises: exit 2, the
record file and the field named, the fix, no traceback, and every file byte-identical (nothing
built, linked, hashed into the lock or recorded). A gate whose smoke passes leaves `verified` as
it was when the record cannot be closed; write-config whose lock cannot be written takes the
record's entry back with the link.

JSON that Python will not hold — an integer of 5000 digits is a bare ValueError in `json.loads`
(`sys.get_int_max_str_digits()`, 4300) — in an engine's answer is the smoke's "could not test"
(exit 2), in the model's own answer a failed check, in what a podman prints a refused podman.

The loopback vLLM stub, its systemctl tripwire, the quick gate profile, the drafter download, the
weights archive and the podman stand-in come from tests/support/badinput.py (shared with the case
files of those commands: a test module never imports another).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.badinput import (
    CONTAINER,
    FAST,
    NOT_AN_ENGINE_FIX,
    PODMAN_FIX,
    STREAM,
    Engine,
    Podman,
    Run,
    Snapshot,
    _chat,
    download,
    no_systemctl,  # noqa: F401  an autouse fixture
    serve_argv,
    write,
    write_config,
)

from specdeploy.core.keeper import load_run
from specdeploy.images import ensure
from specdeploy.profile import load_profile

BIG = "1" * 5000  # a JSON integer Python will not convert (over sys.get_int_max_str_digits())
DIGITS = "4300 digits"
RECORD_FIX = "move run.json aside"

# (id, what is where run.json goes, words the message names besides the record's path)
DAMAGED = [
    ("truncated", b'{"run_id": "r0", "entries": [{"path": "/srv/serving/dra', ["not valid JSON", "line 1"]),
    ("entry-without-keys", b'{"run_id": "r0", "closed": null, "entries": [{}]}', ["entries[0].path", "None"]),
    ("entry-null", b'{"run_id": "r0", "entries": [null]}', ["entries[0]", "expected an object"]),
    ("path-with-nul", b'{"run_id": "r0", "entries": [{"path": "/srv/x\\u0000y", "kind": "absent", "saved_at": 1, '
     b'"copy": null}]}', ["entries[0].path", "\\x00"]),
    ("copy-missing", b'{"run_id": "r0", "entries": [{"path": "/srv/x", "kind": "dir", "saved_at": 1}]}',
     ["entries[0].copy", "None"]),
    ("a-number-of-5000-digits", b'{"run_id": "r0", "entries": [], "n": ' + BIG.encode() + b"}", [DIGITS]),
    ("fifo", None, ["expected a regular file", "FIFO"]),
    ("directory", "dir", ["expected a regular file", "a directory"]),
]  # fmt: skip
DAMAGED_IDS = [d[0] for d in DAMAGED]


def damage(rollback: Path, content: bytes | str | None) -> Path:
    """Put `content` where `rollback`/run.json goes: bytes, a FIFO (None) or a directory ("dir")."""
    record = rollback / "run.json"
    rollback.mkdir(parents=True, exist_ok=True)
    if content is None:
        os.mkfifo(record)
    elif content == "dir":
        write(record / "inside", "x")
    else:
        assert isinstance(content, bytes)
        record.write_bytes(content)
    return record


def runner(run: Run, run_process: Run, content: bytes | str | None) -> Run:
    """A FIFO could block a reader forever: that case runs as a subprocess with a deadline."""
    return run_process if content is None else run


def expect_refused(answer: Any, record: Path, names: list[str]) -> None:
    answer.expect(2, "rollback run record", str(record), *names, fix=RECORD_FIX)


# --------------------------------------------------------------------------- unit install


@pytest.mark.parametrize(("content", "names"), [d[1:] for d in DAMAGED], ids=DAMAGED_IDS)
def test_unit_install_with_a_damaged_run_record_installs_nothing(
    run: Run,
    snapshot: Callable[..., Snapshot],
    run_process: Run,
    tmp_path: Path,
    content: bytes | str | None,
    names: list[str],
) -> None:
    """Was a JSONDecodeError/TypeError traceback (exit 70); a FIFO or a directory was taken for
    "no record" and replaced by a new one (exit 0) — the last good stack's copies forgotten."""
    dest, rollback = tmp_path / "units", tmp_path / "rollback"
    dest.mkdir()
    record = damage(rollback, content)
    before = snapshot(tmp_path)
    answer = runner(run, run_process, content)(
        "unit", "install", dest, "--profile", "cpu-rehearsal", "--rollback-dir", rollback, "--run-id", "r1"
    )
    expect_refused(answer, record, names)
    before.unchanged()


# --------------------------------------------------------------------------- write-config


@pytest.mark.parametrize(("content", "names"), [d[1:] for d in DAMAGED], ids=DAMAGED_IDS)
def test_write_config_with_a_damaged_run_record_switches_nothing(
    run: Run,
    snapshot: Callable[..., Snapshot],
    run_process: Run,
    tmp_path: Path,
    profile_path: Path,  # noqa: F811
    source: Path,  # noqa: F811
    good: dict[str, Any],  # noqa: F811
    content: bytes | str | None,
    names: list[str],
) -> None:
    """A serving link already in place and a newer download: the damaged record is refused before
    anything is built, switched or recorded in the lock."""
    serving, lock = tmp_path / "serving" / "drafter", tmp_path / "state" / "specdeploy.lock"
    write_config(run, serving, profile_path, source, tmp_path / "earlier.lock").expect(0, "config.json written")
    newer = download(tmp_path / "models" / "drafter" / "rev2", dict(good, rms_norm_eps=1e-5), "tokenizer.json")
    rollback = tmp_path / "state" / "rollback"
    record = damage(rollback, content)
    before = snapshot(tmp_path)
    answer = runner(run, run_process, content)(
        "write-config", serving, "--profile", profile_path, "--source", newer, "--lock", lock,
        "--rollback-dir", rollback, "--run-id", "r1",
    )  # fmt: skip
    expect_refused(answer, record, names)
    before.unchanged()


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Path:
    """A directory nothing can be created in: sysfs when root (root ignores modes), else mode 0555."""
    if os.geteuid() == 0:
        if not os.path.ismount("/sys"):
            pytest.skip("root without a sysfs mount: no directory root cannot write")
        return Path("/sys")
    path = tmp_path / "ro"
    path.mkdir()
    path.chmod(0o555)
    return path


def test_write_config_whose_lock_cannot_be_written_takes_the_record_entry_back_with_the_link(
    run: Run,
    snapshot: Callable[..., Snapshot],
    tmp_path: Path,
    profile_path: Path,  # noqa: F811
    source: Path,  # noqa: F811
    good: dict[str, Any],  # noqa: F811
    unwritable_dir: Path,
) -> None:
    """The record's entry was committed before the lock was written: when the lock write failed the
    link went back, but run.json still listed the replacement — a later restore "restored" a write
    that never took effect, and the record and the lock disagreed."""
    serving = tmp_path / "serving" / "drafter"
    write_config(run, serving, profile_path, source, tmp_path / "earlier.lock").expect(0, "config.json written")
    newer = download(tmp_path / "models" / "drafter" / "rev2", dict(good, rms_norm_eps=1e-5), "tokenizer.json")
    rollback, lock = tmp_path / "rollback", unwritable_dir / "specdeploy-badinput.lock"
    before = snapshot(tmp_path / "serving")
    answer = write_config(run, serving, profile_path, newer, lock, "--rollback-dir", rollback, "--run-id", "r1")
    answer.expect(1, str(lock), "switched back", f"{serving} serves what it served before", fix="run the command")
    before.unchanged()
    record = load_run(rollback)
    assert record is None or record.entries == [], f"the record lists a write that was undone: {record}"
    assert not list((rollback / "copies").glob("*")), "a kept copy the record does not list"
    assert not lock.exists()


# --------------------------------------------------------------------------- weights serve


@pytest.mark.parametrize(("content", "names"), [d[1:] for d in DAMAGED], ids=DAMAGED_IDS)
def test_weights_serve_with_a_damaged_run_record_links_and_records_nothing(
    run: Run,
    snapshot: Callable[..., Snapshot],
    run_process: Run,
    archive: dict[str, Path],  # noqa: F811
    content: bytes | str | None,
    names: list[str],
) -> None:
    """Refused before the revisions are hashed into the lock, not after."""
    rollback = archive["root"] / "state" / "rollback"
    record = damage(rollback, content)
    before = snapshot(archive["root"])
    answer = runner(run, run_process, content)(*serve_argv(archive), "--rollback-dir", rollback, "--run-id", "r1")
    expect_refused(answer, record, names)
    before.unchanged()


# --------------------------------------------------------------------------- rollback restore


@pytest.mark.parametrize(("content", "names"), [d[1:] for d in DAMAGED], ids=DAMAGED_IDS)
def test_rollback_restore_with_a_damaged_run_record_touches_nothing(
    run: Run,
    snapshot: Callable[..., Snapshot],
    run_process: Run,
    tmp_path: Path,
    content: bytes | str | None,
    names: list[str],
) -> None:
    state = tmp_path / "state"
    write(tmp_path / "serving" / "drafter" / "config.json", '{"failed": "run"}\n')
    write(state / "rollback" / "copies" / "0" / "config.json", '{"good": "stack"}\n')
    record = damage(state / "rollback", content)
    before = snapshot(tmp_path)
    answer = runner(run, run_process, content)("rollback", "restore", "--run-id", "r0", "--state-dir", state)
    expect_refused(answer, record, [*names, "nothing was restored"])
    before.unchanged()


# --------------------------------------------------------------------------- gate


def _gate(run: Run, profile: Path, state: Path, endpoint: str) -> Any:
    return run("gate", "--profile", profile, "--state-dir", state, "--run-id", "r1", "--endpoint", endpoint)


@pytest.fixture
def verified_state(tmp_path: Path) -> Path:
    """A state directory whose `verified` points at an earlier passing run, r0."""
    state = tmp_path / "state"
    write(state / "runs" / "r0" / "gate.json", '{"verdict": "pass"}\n')
    (state / "verified").symlink_to(Path("runs") / "r0")
    return state


@pytest.mark.parametrize(
    ("content", "names"),
    [d[1:] for d in DAMAGED if d[0] in ("truncated", "entry-without-keys", "directory")],
    ids=["truncated", "entry-without-keys", "directory"],
)
def test_a_passing_gate_with_a_damaged_run_record_leaves_verified_as_it_was(
    run: Run,
    snapshot: Callable[..., Snapshot],
    serve: Callable[..., str],  # noqa: F811
    quick_profile: Path,  # noqa: F811
    verified_state: Path,
    content: bytes | str,
    names: list[str],
) -> None:
    """The link flipped to the new run before closing the record failed: `verified` named a run
    whose pass was never recorded (and a truncated record was a traceback, exit 70)."""
    state = verified_state
    record = damage(state / "rollback", content)
    before = snapshot(state / "rollback", state / "runs" / "r0")
    answer = _gate(run, quick_profile, state, serve(Engine()))
    answer.expect(2, "passed its smoke", "rollback run record", str(record), *names, "was not switched", fix=RECORD_FIX)
    before.unchanged()
    assert os.readlink(state / "verified") == "runs/r0"
    report = json.loads((state / "runs" / "r1" / "gate.json").read_text())
    assert report["verdict"] == "error" and report["exit_code"] == 2 and report["verified"] is False
    assert report["smoke"]["verdict"] == "pass"


def test_a_passing_gate_whose_verified_flip_fails_leaves_its_run_record_open(
    run: Run,
    serve: Callable[..., str],  # noqa: F811
    quick_profile: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The record is closed first now: when the flip then fails (a directory where the `verified`
    link goes), the run is opened again — its copies stay the way back."""
    state = tmp_path / "state"
    write(state / "verified" / "notes", "someone's directory\n")
    entry = {"path": str(tmp_path / "unit"), "kind": "absent", "saved_at": 1.0, "copy": None}
    write(state / "rollback" / "run.json", json.dumps({"run_id": "r1", "closed": None, "entries": [entry]}))
    answer = _gate(run, quick_profile, state, serve(Engine()))
    answer.expect(1, str(state / "verified"), fix="run the command again")
    record = load_run(state / "rollback")
    assert record is not None and record.open, f"a run that was not verified is closed: {record}"
    assert (state / "verified" / "notes").is_file()


# --------------------------------------------------------------------------- smoke: 5000 digits


@dataclass
class BigNumbers(Engine):
    """A healthy stub whose model answers the JSON known-answer prompt with a 5000-digit number."""

    def answer(self, key: str, body: dict[str, Any]) -> tuple[int, Any]:
        if key == "POST /v1/chat/completions" and "JSON object" in body["messages"][0]["content"]:
            return 200, _chat('{"ok": ' + BIG + "}")
        return super().answer(key, body)


BIG_BODIES = [
    ("models", "GET /v1/models", '{"object": "list", "data": [{"id": "tiny-qwen3", "created": ' + BIG + "}]}",
     "readiness", "/v1/models"),
    ("version", "GET /version", '{"version": "0.32.0", "build": ' + BIG + "}", "identity", "/version"),
    ("chat-usage", "POST /v1/chat/completions", '{"choices": [{"message": {"content": "Paris"}, '
     '"finish_reason": "stop"}], "usage": {"completion_tokens": ' + BIG + "}}", "coherence", "/v1/chat/completions"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("route", "body", "stage", "where"), [b[1:] for b in BIG_BODIES], ids=[b[0] for b in BIG_BODIES]
)
def test_an_engine_answer_with_a_5000_digit_number_is_could_not_test(
    run: Run,
    serve: Callable[..., str],  # noqa: F811
    tmp_path: Path,
    route: str,
    body: str,
    stage: str,
    where: str,
) -> None:
    """A bare ValueError from json.loads: exit 70, no report."""
    report = tmp_path / "smoke.json"
    answer = run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(Engine({route: (200, body)})),
                 "--json", report, *FAST)  # fmt: skip
    answer.expect(2, where, DIGITS, "could not test", fix=NOT_AN_ENGINE_FIX)
    on_disk = json.loads(report.read_text())
    assert on_disk["verdict"] == "error" and on_disk["exit_code"] == 2
    assert next(s for s in on_disk["stages"] if s["name"] == stage)["status"] == "error"


def test_a_stream_chunk_with_a_5000_digit_number_is_could_not_test(
    run: Run,
    serve: Callable[..., str],  # noqa: F811
    tmp_path: Path,
) -> None:
    engine = Engine(stream=[*STREAM[:2], '{"choices": [], "usage": {"completion_tokens": ' + BIG + "}}"])
    report = tmp_path / "smoke.json"
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(engine), "--json", report, *FAST).expect(
        2, "/v1/completions (stream)", DIGITS, fix=NOT_AN_ENGINE_FIX
    )
    assert json.loads(report.read_text())["exit_code"] == 2


def test_a_models_json_answer_with_a_5000_digit_number_fails_its_check_not_the_smoke(
    run: Run,
    serve: Callable[..., str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The model's own answer is judged, not decoded blindly: a wrong answer, never a crash."""
    report = tmp_path / "smoke.json"
    answer = run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(BigNumbers()), "--json", report, *FAST)
    answer.expect(1, "not a JSON object", DIGITS, fix="incoherent")
    assert json.loads(report.read_text())["verdict"] == "fail"


def test_a_gate_whose_engine_answers_a_5000_digit_number_could_not_test_and_rolls_back(
    run: Run,
    serve: Callable[..., str],  # noqa: F811
    quick_profile: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Was "the gate itself failed" (exit 70), and no rollback ran."""
    state = tmp_path / "state"
    engine = Engine({"GET /v1/models": (200, BIG_BODIES[0][2])})
    _gate(run, quick_profile, state, serve(engine)).expect(2, "/v1/models", DIGITS, fix=NOT_AN_ENGINE_FIX)
    report = json.loads((state / "runs" / "r1" / "gate.json").read_text())
    assert report["verdict"] == "error" and "replaced nothing" in report["rollback"]["message"]
    assert not (state / "verified").exists()


# --------------------------------------------------------------------------- image check: 5000 digits


def test_image_check_refuses_labels_with_a_5000_digit_number(run: Run, tmp_path: Path) -> None:
    """A podman printing labels Python will not hold: a ValueError traceback (exit 70)."""
    podman = Podman(tmp_path / "stub", by_verb={"image inspect": '{"org.opencontainers.image.version": ' + BIG + "}"})
    run("image", "check", "some/image", "--profile", CONTAINER, "--podman", podman).expect(
        2, "--podman", "expected a JSON object of labels", DIGITS, fix=PODMAN_FIX
    )


def test_an_inside_inspect_printing_a_5000_digit_number_is_a_failed_row_not_a_crash(tmp_path: Path) -> None:
    """What the image's build guard prints (`image check`'s "inside" rows) goes through the same
    decoder: a failed row naming why, never a ValueError."""
    podman = Podman(tmp_path / "stub", by_verb={"run": '{"vllm": ' + BIG + "}"})
    rows = ensure.inside_rows("some/image", load_profile(CONTAINER), str(podman))
    assert [r.ok for r in rows] == [False] and DIGITS in str(rows[0].found) and "usable JSON" in str(rows[0].found)
