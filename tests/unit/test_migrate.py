"""`specdeploy migrate`'s pure parts: verify's comparison of two gate reports and the migration record.

OLD's report is a real one (tests/data/migrate/README.md: recorded from a real vLLM-CPU deploy on the
rehearsal host); NEW's reports are that one with one field changed, as a NEW host would differ."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support import front as front_support
from tests.support.data import DATA

from specdeploy.core import progress
from specdeploy.core.errors import SpecdeployError
from specdeploy.front.balancer import HAProxyBalancer, cutover
from specdeploy.front.config import Backend
from specdeploy.front.runtime import RuntimeApi
from specdeploy.migrate import compare, load, record, seed

OLD = json.loads((DATA / "migrate" / "gate-cpu-rehearsal.json").read_text())


def _new(**changes: Any) -> dict[str, Any]:
    """NEW's passing gate: OLD's report, its gate having compared with OLD's golden (what prepare's
    copied golden makes happen), then `changes` applied (dotted paths; `stage:NAME.KEY` a stage's detail)."""
    new = copy.deepcopy(OLD)
    new["golden"] = {
        "key": OLD["golden"]["key"],
        "identity": copy.deepcopy(OLD["golden"]["identity"]),
        "compared_with": f"/var/lib/specdeploy/state/golden/{OLD['golden']['key']}.json",
    }
    for where, value in changes.items():
        if where.startswith("stage:"):
            name, key = where[len("stage:") :].split(".", 1)
            compare.stage(new, name)["details"][key] = value
        else:
            *parents, last = where.split(".")
            node = new
            for part in parents:
                node = node[part]
            node[last] = value
    return new


def _differences(new: dict[str, Any], tolerance: float = 0.25) -> dict[str, compare.Line]:
    return {d.what: d for d in compare.compare(OLD, new, decode_rate_tolerance=tolerance).differences}


def test_a_new_host_serving_the_same_stack_compares_equal_on_every_line() -> None:
    result = compare.compare(OLD, _new(), decode_rate_tolerance=0.25)
    assert result.same, result.summary()
    assert {line.what for line in result.lines} >= {
        "gate verdict",
        "served engine and version",
        "served speculation (method, k)",
        "golden transcript",
        "acceptance (95% interval)",
        "decode tok/s",
        *(f"identity: {f}" for f in compare.IDENTITY_FIELDS),
    }
    assert json.loads(json.dumps(result.to_json()))["same"] is True


def test_another_served_engine_version_is_named_with_both_values() -> None:
    diffs = _differences(_new(**{"stage:identity.version": "0.31.0"}))
    line = diffs["served engine and version"]
    assert line.old == "vllm 0.32.0" and line.new == "vllm 0.31.0"
    assert (
        "OLD vllm 0.32.0, NEW vllm 0.31.0"
        in compare.compare(OLD, _new(**{"stage:identity.version": "0.31.0"}), decode_rate_tolerance=0.25).summary()
    )


@pytest.mark.parametrize("field", ["image_id", "lock_sha256", "version", "commit"])
def test_each_identity_field_that_differs_stops_verify(field: str) -> None:
    diffs = _differences(_new(**{f"golden.identity.{field}": "something-else"}))
    assert f"identity: {field}" in diffs and diffs[f"identity: {field}"].new == "something-else"


def test_a_new_host_whose_gate_recorded_its_own_golden_did_not_match_old_s() -> None:
    new = _new()
    new["golden"].pop("compared_with")
    new["golden"]["recorded_to"] = "/var/lib/specdeploy/state/runs/x/golden.json"
    assert "golden transcript" in _differences(new)


def test_acceptance_wholly_below_old_s_interval_differs_and_an_overlap_does_not() -> None:
    low, high = OLD["smoke"]["stages"][[s["name"] for s in OLD["smoke"]["stages"]].index("acceptance")]["details"][
        "interval_95"
    ]
    assert "acceptance (95% interval)" in _differences(_new(**{"stage:acceptance.interval_95": [1.0, low - 0.01]}))
    assert "acceptance (95% interval)" not in _differences(_new(**{"stage:acceptance.interval_95": [1.0, low + 0.01]}))
    assert high > low


def test_decode_rate_below_the_tolerance_differs_and_an_unmeasurable_rate_is_not_compared() -> None:
    rate = compare.stage(OLD, "throughput")["details"]["decode_tokens_per_s"]
    assert "decode tok/s" in _differences(_new(**{"stage:throughput.decode_tokens_per_s": rate * 0.5}), 0.25)
    assert "decode tok/s" not in _differences(_new(**{"stage:throughput.decode_tokens_per_s": rate * 0.8}), 0.25)
    unmeasured = compare.compare(
        OLD, _new(**{"stage:throughput.decode_tokens_per_s": None}), decode_rate_tolerance=0.25
    )
    line = next(x for x in unmeasured.lines if x.what == "decode tok/s")
    assert line.same is None and "not measurable" in line.note and unmeasured.same


def test_a_report_without_an_identity_differs_on_every_identity_line_naming_whose() -> None:
    """Found by review: a missing identity was "not compared" and verify passed. Nothing then shows
    NEW is OLD's stack, so traffic must stay on OLD."""
    new = _new()
    new["golden"].pop("identity")
    diffs = _differences(new)
    assert {f"identity: {f}" for f in compare.IDENTITY_FIELDS} <= set(diffs)
    assert "NEW's report has no identity" in diffs["identity: image_id"].note


def test_an_acceptance_interval_only_one_report_has_differs_and_none_in_both_is_not_compared() -> None:
    diffs = _differences(_new(**{"stage:acceptance.interval_95": None}))
    assert "NEW's report has no acceptance interval" in diffs["acceptance (95% interval)"].note
    neither = copy.deepcopy(OLD)
    compare.stage(neither, "acceptance")["details"]["interval_95"] = None
    both = _new(**{"stage:acceptance.interval_95": None})
    line = next(x for x in compare.compare(neither, both, decode_rate_tolerance=0.25).lines if "acceptance" in x.what)
    assert line.same is None and "neither" in line.note


def test_a_failed_new_gate_differs() -> None:
    assert "gate verdict" in _differences(_new(verdict="fail"))


def test_the_record_round_trips_and_steps_need_their_predecessors(tmp_path: Path) -> None:
    rec = record.MigrationRecord(old="old-host", new="new-host", profile="cpu-rehearsal-container")
    assert rec.may_start("plan") is None and "migrate plan" in (rec.may_start("prepare") or "")
    rec.start("plan")
    rec.end("plan", True, "planned", {"bytes": 10})
    assert rec.may_start("prepare") is None and "migrate prepare" in (rec.may_start("verify") or "")
    rec.start("prepare")
    rec.end("prepare", False, "copy failed")
    assert "failed" in (rec.may_start("verify") or "")
    saved = record.save(tmp_path, rec)
    assert saved == tmp_path / "migrations" / "old-host--new-host.json"
    again = record.load(tmp_path, "old-host", "new-host")
    assert again == rec and record.load(tmp_path, "old-host", "other") is None


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    """record.now() one second later on every call: runs in one test are ordered as on a host."""
    import datetime as dt

    clock = iter(range(10_000))
    start = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
    monkeypatch.setattr(record, "now", lambda: (start + dt.timedelta(seconds=next(clock))).isoformat())


def _run(rec: record.MigrationRecord, step: record.Step, ok: bool = True) -> None:
    assert rec.may_start(step) is None, rec.may_start(step)
    rec.start(step)
    rec.end(step, ok, step)


def test_a_prepare_run_again_after_verify_passed_stops_cutover_until_verify_runs_again(ticking: None) -> None:
    """The safety gap a review found: verify passed, prepare re-ran (NEW changed), and cutover
    would have sent traffic to a NEW nobody had verified since."""
    rec = record.MigrationRecord(old="old-host", new="new-host")
    for step in ("plan", "prepare", "verify"):
        _run(rec, step)  # type: ignore[arg-type]
    assert rec.may_start("cutover") is None
    _run(rec, "prepare")
    why = rec.may_start("cutover") or ""
    assert "`migrate verify` done after the last `migrate prepare`" in why and "run `migrate verify` again" in why
    _run(rec, "verify")
    assert rec.may_start("cutover") is None


def test_a_plan_run_again_stops_verify_and_cutover_until_prepare_and_verify_follow_it(ticking: None) -> None:
    rec = record.MigrationRecord(old="old-host", new="new-host")
    for step in ("plan", "prepare", "verify", "plan"):
        _run(rec, step)  # type: ignore[arg-type]
    assert "after the last `migrate plan`" in (rec.may_start("verify") or "")
    assert "`migrate verify` done after the last `migrate plan`" in (rec.may_start("cutover") or "")
    _run(rec, "prepare")
    assert "run `migrate verify` again" in (rec.may_start("cutover") or "")
    _run(rec, "verify")
    assert rec.may_start("cutover") is None


def test_plan_and_prepare_are_refused_while_new_takes_traffic_and_rollback_may_always_run(ticking: None) -> None:
    rec = record.MigrationRecord(old="old-host", new="new-host")
    assert rec.may_start("rollback") is None  # before any step: going back is never refused
    for step in ("plan", "prepare", "verify", "cutover"):
        _run(rec, step)  # type: ignore[arg-type]
    rec.traffic_on = "new"
    for step in ("plan", "prepare"):
        assert "`migrate rollback` first" in (rec.may_start(step) or "")
    assert rec.may_start("rollback") is None and rec.may_start("cutover") is None
    _run(rec, "rollback")
    rec.traffic_on = "old"
    assert rec.may_start("prepare") is None


def test_every_run_of_a_step_keeps_its_time_and_what_it_measured(cli: Any, tmp_path: Path) -> None:
    """docs/benchmarks.md's migration figures come from here: each run's seconds, the bytes a
    prepare copied, a cutover's move time and the requests the front saw fail; a resumed step shows
    both runs."""
    rec = record.MigrationRecord(old="old-host", new="new-host", profile="cpu-rehearsal-container")
    rec.start("prepare")
    rec.end("prepare", False, "interrupted", {"hint": "run it again"})
    rec.start("prepare")
    rec.end("prepare", True, "prepared", {"seed": {"bytes_copied": 4096, "copied": 2}})
    rec.start("cutover")
    rec.end("cutover", True, "moved", {"duration_s": 3.25, "failed_requests_at_front": 0})
    runs = rec.runs()
    assert [(r["step"], r["event"]) for r in runs] == [("prepare", "failed"), ("prepare", "done"), ("cutover", "done")]
    assert all(isinstance(r["seconds"], float) and r["seconds"] >= 0 for r in runs)
    assert "bytes_copied" not in runs[0] and runs[1]["bytes_copied"] == 4096
    assert (runs[2]["move_s"], runs[2]["failed_requests"]) == (3.25, 0)
    # a prepare that also seeded OLD's image archive (--image-from-old) copied both
    archived = {"seed": {"bytes_copied": 4096}, "image": {"tag": "t", "bytes_copied": 884_015_616}}
    assert record.figures("prepare", archived) == {"bytes_copied": 884_019_712}
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("")
    record.save(tmp_path, rec)
    shown = cli("migrate", "show", "--from", "old-host", "--to", "new-host", "--inventory", inventory)
    assert shown.exit_code == 0, shown.output
    assert "every run" in shown.output and "4096" in shown.output and "3.25" in shown.output


def test_a_damaged_record_names_the_field_and_stops_every_step(tmp_path: Path) -> None:
    where = record.path(tmp_path, "a", "b")
    where.parent.mkdir(parents=True)
    where.write_text(json.dumps({"schema_version": 1, "old": "a", "new": "b", "traffic_on": "sideways"}))
    with pytest.raises(SpecdeployError) as caught:
        record.load(tmp_path, "a", "b")
    assert "traffic_on" in caught.value.message and "sideways" in caught.value.message
    assert caught.value.exit_code == 2 and caught.value.hint


def test_a_host_name_that_is_no_inventory_name_is_refused() -> None:
    with pytest.raises(SpecdeployError) as caught:
        record.check_host_name("new host; rm -rf /", "--to")
    assert "--to" in caught.value.message


# --------------------------------------------------------------------------- seeding NEW's weights


def _hosts(tmp_path: Path) -> tuple[seed.LocalSide, seed.LocalSide, list[seed.SeedFile]]:
    """OLD with two files of a revision (one of several chunks), NEW empty; real files, real hashes."""
    old, new = seed.LocalSide(tmp_path / "old", "old"), seed.LocalSide(tmp_path / "new", "new")
    base = "/srv/models/org/model/abc123"
    contents = {"config.json": b'{"a": 1}', "model.safetensors": bytes(range(256)) * (3 * seed.CHUNK // 256 + 7)}
    items = []
    for name, data in contents.items():
        target = old._p(f"{base}/{name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        items.append(seed.SeedFile("target", "abc123", f"{base}/{name}", hashlib.sha256(data).hexdigest()))
    return old, new, items


def test_seeding_copies_every_file_verified_and_a_second_run_copies_nothing(tmp_path: Path) -> None:
    old, new, items = _hosts(tmp_path)
    first = seed.seed(old, new, items)
    assert first.copied == 2 and first.bytes_copied == sum(old.size(i.path) or 0 for i in items)
    assert all(new.sha256(i.path) == i.sha256 for i in items)
    again = seed.seed(old, new, items)
    assert again.copied == 0 and again.bytes_copied == 0
    assert [f["action"] for f in again.files] == ["already verified", "already verified"]


def test_an_interrupted_seed_resumes_from_the_partial_file_s_size(tmp_path: Path) -> None:
    old, new, items = _hosts(tmp_path)
    big = items[1]
    total = old.size(big.path) or 0
    new.makedirs(str(Path(big.path).parent))
    with old.reader(big.path, 0) as src, new.appender(big.path + seed.PART) as dst:
        dst.write(src.read(seed.CHUNK + 5))  # the copy stopped there
    result = seed.seed(old, new, items)
    resumed = next(f for f in result.files if f["path"] == big.path)
    assert resumed["action"] == f"resumed at byte {seed.CHUNK + 5}"
    assert resumed["bytes_copied"] == total - seed.CHUNK - 5
    assert new.sha256(big.path) == big.sha256 and new.size(big.path + seed.PART) is None


def test_a_file_saved_elsewhere_on_old_is_seeded_to_its_own_path_on_new_and_resumes(tmp_path: Path) -> None:
    """`prepare --image-from-old`: OLD's image archive, saved beside OLD's state, lands at NEW's archive
    path (where the images role loads it), verified, and an interrupted copy resumes."""
    old, new = seed.LocalSide(tmp_path / "old", "old"), seed.LocalSide(tmp_path / "new", "new")
    data = bytes(range(256)) * (2 * seed.CHUNK // 256 + 3)
    saved = old._p("/var/lib/specdeploy/migrate/engine-image-0123456789ab.tar")
    saved.parent.mkdir(parents=True)
    saved.write_bytes(data)
    item = seed.SeedFile(
        "image", "0123456789ab", "/var/lib/specdeploy/image.tar", hashlib.sha256(data).hexdigest(),
        source="/var/lib/specdeploy/migrate/engine-image-0123456789ab.tar",
    )  # fmt: skip
    new.makedirs("/var/lib/specdeploy")
    new._p(item.path + seed.PART).write_bytes(data[:1000])  # a copy interrupted at byte 1000
    result = seed.seed(old, new, [item])
    assert result.files == [{"path": item.path, "action": "resumed at byte 1000", "bytes_copied": len(data) - 1000}]
    assert new.sha256(item.path) == item.sha256 and new.size(item.source_path) is None
    assert seed.seed(old, new, [item]).copied == 0


def test_a_partial_file_that_is_no_prefix_is_copied_again_from_the_start(tmp_path: Path) -> None:
    old, new, items = _hosts(tmp_path)
    big = items[1]
    new.makedirs(str(Path(big.path).parent))
    new._p(big.path + seed.PART).write_bytes(b"garbage" * 100)
    seed.seed(old, new, items)
    assert new.sha256(big.path) == big.sha256


def test_a_file_on_old_that_differs_from_the_lock_stops_the_seed_and_is_not_put_in_place(tmp_path: Path) -> None:
    old, new, items = _hosts(tmp_path)
    old._p(items[0].path).write_bytes(b'{"a": 2}')  # OLD's copy damaged after the lock recorded it
    with pytest.raises(SpecdeployError) as caught:
        seed.seed(old, new, items)
    assert items[0].path in caught.value.message and items[0].sha256 in caught.value.message
    assert "traffic stays on OLD" in (caught.value.hint or "")
    assert new.size(items[0].path) is None  # never renamed into place


def test_a_damaged_site_mirror_is_named_and_nothing_is_put_in_place(tmp_path: Path) -> None:
    """`migrate prepare --seed-from MIRROR`: the mirror is the source side, verified like OLD."""
    import shutil

    old, new, items = _hosts(tmp_path)
    shutil.copytree(tmp_path / "old", tmp_path / "mirror")
    mirror = seed.LocalSide(tmp_path / "mirror", "site-mirror")
    mirror._p(items[0].path).write_bytes(b'{"a": 3}')
    with pytest.raises(SpecdeployError) as caught:
        seed.seed(mirror, new, items)
    assert "copied from site-mirror" in caught.value.message and "site-mirror's file differs" in caught.value.message
    assert new.size(items[0].path) is None
    mirror._p(items[0].path).write_bytes(old._p(items[0].path).read_bytes())
    seed.seed(mirror, new, items)  # the mirror mended: the rest is copied, the bad part replaced
    assert all(new._p(i.path).read_bytes() == old._p(i.path).read_bytes() for i in items)


# --------------------------------------------------------------------------- load through the front


def test_a_cutover_through_the_real_haproxy_under_streaming_load_fails_no_request(pem: Path, short_dir: Path) -> None:
    """The real HAProxy (Debian's) in front of two engine stand-ins whose streams last as long as
    their tokens (0.6 s for the shortest request): the load keeps 4 streams open through TLS with a
    key while the cutover adds NEW, drains OLD (its streams finish) and takes it out. Every request is
    counted; none fails; at no instant were fewer than 2 open; both engines served some, and OLD had
    streams in flight when it was drained."""
    with front_support.engines("old", "new") as engines:
        for engine in engines.values():
            engine.token_s = 0.6 / 256
        backends = [
            Backend(name="old", address="127.0.0.1", port=engines["old"].port),
            Backend(name="new", address="127.0.0.1", port=engines["new"].port, state="maint"),
        ]
        config = front_support.front_config(short_dir, pem, backends)
        with front_support.running(config, short_dir, ready=("old",)) as front:
            spec = load.LoadSpec(
                url=f"https://127.0.0.1:{front.port}", api_key="sk-test", model="m", total=24, in_flight=4,
                max_tokens=256, ca_file=str(pem), timeout_s=30,
            )  # fmt: skip
            balancer = HAProxyBalancer(RuntimeApi(front.socket), drain_timeout_s=20, up_timeout_s=10, poll_s=0.05)
            with load.Load(spec) as running_load:
                assert running_load.wait_streaming(3, 20)
                in_flight_on_old = RuntimeApi(front.socket).sessions("old")
                steps = cutover(balancer, new="new", old="old")
                result = running_load.finish(60)
    assert result.failed == 0 and result.sent == 24 and result.ok == 24, result.to_json()
    assert result.max_in_flight == 4 and (result.min_in_flight_while_running or 0) >= 2, result.to_json()
    assert in_flight_on_old >= 1 and [s["step"] for s in steps] == ["add", "drain", "remove", "backup"]
    served = {name: len([r for r in e.requests() if r[1] == "/v1/chat/completions"]) for name, e in engines.items()}
    assert served["old"] >= 1 and served["new"] >= 1 and sum(served.values()) == 24
    assert {r[2] for e in engines.values() for r in e.requests()} == {"Bearer sk-test"}


def test_stopping_a_load_whose_streams_outlast_the_ticker_says_how_many_still_stream(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No silent minutes (issue 37): after a loaded step ends, the load's last streams finish, a
    minute on the real model's engine (`rehearsal migrate` went 61 s without a line there). The wait is
    a progress step whose lines say what is left; an engine stand-in streams each request for 1.5 s."""
    monkeypatch.setenv(progress.PERIOD_ENV, "0.3")
    with front_support.engines("slow") as engines:
        engines["slow"].token_s = 1.5 / 64
        spec = load.LoadSpec(
            url=f"http://127.0.0.1:{engines['slow'].port}", api_key="k", model="m", total=50, in_flight=2,
            max_tokens=64, timeout_s=30,
        )  # fmt: skip
        with load.Load(spec) as running_load:
            assert running_load.wait_streaming(2, 10)
            capsys.readouterr()
            result = running_load.stop()
    said = [line for line in capsys.readouterr().err.splitlines() if "the load sends no more" in line]
    assert said and re.search(r": \d+(\.\d+)?s, last: 2 sent, 0 ok, 0 failed, 2 still streaming$", said[0]), said
    assert result.sent == 2 and result.ok == 2 and result.failed == 0


def _request(index: int, started: float, ended: float | None) -> load.Request:
    return load.Request(index=index, started=started, ended=ended)


def test_requests_ending_in_step_are_seen_as_the_load_dropping_to_none() -> None:
    """The measure behind "at least 2 in flight at every moment" can fail: four requests of one
    length, started together, end together before their replacements start — 0 open for an
    instant, which sampling the count after each refill (as the load first did) never saw."""
    in_step = [_request(i, 0.0, 1.0) for i in range(4)] + [_request(4 + i, 1.001, 2.0) for i in range(4)]
    assert load.min_open(in_step, start=0.0, end=1.5) == 0
    staggered = [_request(0, 0.0, 1.0), _request(1, 0.0, 1.1), _request(2, 0.0, 1.2), _request(3, 0.0, 1.3)]
    staggered += [_request(4, 1.001, 2.0), _request(5, 1.101, 2.2), _request(6, 1.201, 2.4), _request(7, 1.301, 2.6)]
    assert load.min_open(staggered, start=0.0, end=1.5) == 3  # one end at a time: never below in_flight - 1
    late = [*staggered[:4], _request(4, 1.001, None)]  # still running: open to the end
    assert load.min_open(late, start=1.05, end=5.0) == 1


def test_the_requests_open_at_an_instant_are_those_started_and_not_yet_ended() -> None:
    """What a loaded move's failure message reports beside the front's count at the drain."""
    result = load.LoadResult(requests=[_request(0, 0.0, 1.0), _request(1, 0.5, 2.0), _request(2, 1.5, None)])
    assert [result.open_at(t) for t in (0.0, 0.75, 1.0, 1.75, 9.0)] == [1, 2, 1, 2, 1]


def test_streams_that_end_in_one_turn_of_the_client_leave_all_but_one_open() -> None:
    """Every round, the four streams are held until all four are open and then end in the same turn
    of the client's event loop (what a loaded CI machine did: the count read 1). Each slot starts its
    next request as its last one ends, so the sweep never sees fewer than in_flight - 1 open. The
    transport is httpx's MockTransport: what is tested is the client's own scheduling."""
    import asyncio

    import httpx

    waiting: list[asyncio.Future[None]] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        held = asyncio.get_running_loop().create_future()
        waiting.append(held)
        if len(waiting) == 4:  # the round is full: all four end at once
            for future in waiting:
                future.set_result(None)
            waiting.clear()
        await held
        return httpx.Response(200, content=b'data: {"choices": []}\n\ndata: [DONE]\n\n')

    class Held(load.Load):
        def _client(self) -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url="https://front", transport=httpx.MockTransport(engine))

    spec = load.LoadSpec(url="https://front", api_key="k", model="m", total=12, in_flight=4)
    with Held(spec) as running_load:
        result = running_load.finish(30)
    assert result.sent == 12 and result.ok == 12, result.to_json()
    assert result.max_in_flight == 4 and result.min_in_flight_while_running == 3, result.to_json()


def test_each_slot_keeps_a_length_of_its_own_so_ends_do_not_arrive_in_step() -> None:
    spec = load.LoadSpec(url="https://front", api_key="k", model="m", in_flight=4, max_tokens=448)
    assert [load.tokens_for(slot, spec) for slot in range(4)] == [448, 420, 392, 364]  # each outlasts the drain
    # a stand-in for the engine's decode: every slot's request takes its length in steps, and a
    # slot's next request starts the step after: no three slots ever end in one step
    ends: dict[int, int] = {}
    for slot in range(4):
        step = 0
        for _ in range(60):
            step += load.tokens_for(slot, spec) + 1
            ends[step] = ends.get(step, 0) + 1
    assert max(ends.values()) <= 2


def test_a_load_against_a_front_that_refuses_counts_every_request_as_failed(pem: Path, short_dir: Path) -> None:
    """The same load with no engine up behind the front: every request fails with its status (503
    from HAProxy), and none is lost from the count."""
    backends = [Backend(name="gone", address="127.0.0.1", port=front_support.free_port())]
    config = front_support.front_config(short_dir, pem, backends)
    with front_support.running(config, short_dir) as front:
        spec = load.LoadSpec(
            url=f"https://127.0.0.1:{front.port}", api_key="k", model="m", total=5, in_flight=2,
            ca_file=str(pem), timeout_s=10,
        )  # fmt: skip
        with load.Load(spec) as running_load:
            result = running_load.finish(30)
    assert result.sent == 5 and result.failed == 5 and result.ok == 0
    assert all("HTTP 503" in (f["error"] or "") for f in result.to_json()["failures"])


# --------------------------------------------------------------------------- the human runbook


def test_every_step_in_the_code_has_its_row_in_docs_migration_md() -> None:
    """docs/migration.md is the human runbook for the same steps: a row per step (command, checks,
    failure, recovery), and every `specdeploy migrate` command named in it."""
    from specdeploy.cli.migrate import migrate_app

    text = (Path(__file__).resolve().parents[2] / "docs" / "migration.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    for step in record.STEPS:
        assert step in rows and f"`migrate {step}" in rows[step], step
        assert len([c for c in rows[step].split("|") if c.strip()]) == 5, rows[step]
    for command in migrate_app.registered_commands:
        assert f"migrate {command.name}" in text, command.name
    assert set(record.REQUIRES) == set(record.STEPS)


def test_a_file_that_cannot_be_written_on_new_stops_the_seed_with_the_files_done_kept(tmp_path: Path) -> None:
    """A path on NEW taken by a directory (as a full disk or a permission would stop it): a clear
    error naming the file and how many are in place; the re-run, once it is fixed, copies only the rest."""
    old, new, items = _hosts(tmp_path)
    blocked = new._p(items[1].path + seed.PART)
    blocked.mkdir(parents=True)
    with pytest.raises(SpecdeployError) as caught:
        seed.seed(old, new, items)
    assert items[1].path in caught.value.message and "1 of 2 files are in place" in caught.value.message
    assert new.sha256(items[0].path) == items[0].sha256
    blocked.rmdir()
    again = seed.seed(old, new, items)
    assert [f["action"] for f in again.files] == ["already verified", "copied"]


def test_ansible_programs_are_found_beside_this_python_without_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`specdeploy migrate` run as .venv/bin/specdeploy, the venv not on PATH (as `rehearsal migrate`
    was first run): ansible-playbook is the venv's own."""
    from specdeploy.core.programs import ansible_program

    monkeypatch.setenv("PATH", "/nonexistent")
    found = ansible_program("ansible-playbook", why="NEW cannot be deployed")
    assert Path(found).parent == Path(sys.executable).parent


def test_the_rehearsal_s_steps_run_the_real_cli_in_order_and_stop_at_the_first_that_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specdeploy rehearsal migrate`'s loop (migration.run_steps), as docs/rehearsal.md's "Rehearsing a
    host move" runs it: each step's command printed, then `specdeploy migrate STEP` run for real. Here
    OLD is a host nothing answers for (a closed loopback port), so plan fails, names OLD and what
    to do, and no later step runs: the move is not done."""
    from specdeploy.rehearsal import hosts, migration

    key = tmp_path / "key"
    key.write_text("not a key")
    old, new, front = (hosts.Host(name, port, key) for name, port in (("old-host", 1), ("new-host", 2), ("fr", 3)))
    inventory = migration.write_inventory(
        tmp_path, old=old, old_ip="10.0.0.1", new=new, front=front, profile="cpu-rehearsal-container",
        cert=tmp_path / "front.pem",
    )  # fmt: skip
    (tmp_path / "vault-password").write_text("unused")
    move = migration.Move(inventory, old, new, front, tmp_path / "vault-password", [], tmp_path / "logs")
    spec = load.LoadSpec(url="https://127.0.0.1:1", api_key="unused", model="unused")
    rows = migration.run_steps(move, migration.STEPS, spec)
    assert [(r["step"], r["exit"]) for r in rows] == [("plan", 1)]
    assert "old-host (127.0.0.1:1)" in rows[0]["summary"] and "fix:" in rows[0]["summary"]
    assert "$ migrate plan --from old-host --to new-host" in capsys.readouterr().err
    assert (tmp_path / "logs" / "migrate-plan.log").is_file()
    # the whole step ran inside one progress step (a line every 20 s while it runs; issue 37)
    assert re.search(r"^\d\d:\d\d:\d\d migrate plan: failed after \d+s$", rows[0]["summary"] + "\n"
                     + (tmp_path / "logs" / "migrate-plan.log").read_text(), re.M)  # fmt: skip
    assert not migration.moved(rows)
    # each row says its longest stretch without a line of output (issue 37), timed on the real run
    assert 0 < rows[0]["longest_silence_s"] == round(move.silences["plan"], 1) < progress.MAX_SILENCE_S


def test_a_move_is_done_only_when_every_step_passed_and_no_loaded_request_failed() -> None:
    from specdeploy.rehearsal import migration

    passed = [{"step": s, "exit": 0} for s in migration.STEPS]
    assert migration.moved(passed)
    assert migration.moved([*passed[:-1], {"step": "cutover", "exit": 0, "load": {"failed": 0}}])
    assert not migration.moved([*passed[:-1], {"step": "cutover", "exit": 0, "load": {"failed": 1}}])
    assert not migration.moved(passed[:-1])
    assert not migration.moved([*passed[:-1], {"step": "cutover", "exit": 1}])
    assert migration.moved([*passed, {"step": "finish", "exit": 0}])  # `rehearsal migrate --finish`
    assert not migration.moved([*passed, {"step": "finish", "exit": 1}])


def test_prepare_gives_new_old_s_image_by_pull_or_archive_and_refuses_a_rebuild() -> None:
    from specdeploy.migrate import steps

    assert steps.image_source([]) == "pull"  # passed explicitly to NEW's deploy
    assert steps.image_source([], "archive") == "archive"  # an air-gapped site's inventory setting is kept
    assert steps.image_source(["-e", "images_registry=r:5000", "-e", "images_source=archive"]) == "archive"
    assert steps.image_source(["--extra-vars=images_source=archive"], "pull") == "archive"
    assert steps.image_source(["-e", "weights_source=present images_source=archive"]) == "archive"
    for args, inventory in ((["--extra-vars", "images_source=build"], None), ([], "build")):
        with pytest.raises(steps.StepError) as refused:
            steps.image_source(args, inventory)
        assert "images_source=build" in refused.value.message and "pull, archive" in refused.value.message
    for unreadable in ("@site-vars.yml images_source", '{"images_source": "build"}'):
        with pytest.raises(steps.StepError, match="does not read"):
            steps.image_source(["-e", unreadable])


def test_the_load_s_api_key_is_never_in_its_spec_s_repr() -> None:
    key = "sk-CANARY-repr-0001"
    spec = load.LoadSpec(url="https://127.0.0.1:8443", api_key=key, model="m")
    assert key not in repr(spec) and key not in str(spec)


def test_plan_refuses_a_new_host_whose_disk_cannot_take_the_weights_naming_both_figures() -> None:
    from specdeploy.migrate import steps

    gib = 1024**3
    assert steps.space_problem("new-host", "/var/lib/specdeploy/models", free=60 * gib, needed=54 * gib) is None
    problem = steps.space_problem("new-host", "/var/lib/specdeploy/models", free=40 * gib, needed=54 * gib) or ""
    assert "new-host: 40.0 GiB free for /var/lib/specdeploy/models" in problem
    assert "54.0 GiB of weights NEW lacks" in problem and "would fill NEW's disk" in problem


def test_the_free_space_probe_runs_with_a_bare_python_and_reads_the_nearest_existing_parent(tmp_path: Path) -> None:
    """What plan runs on NEW before anything is installed there (no CLI): a real python3, a path
    whose directories do not exist yet."""
    import shutil
    import subprocess

    from specdeploy.migrate import steps

    before = shutil.disk_usage(tmp_path).free
    done = subprocess.run(
        ["python3", "-c", steps.FREE_BYTES, str(tmp_path / "not" / "yet" / "models")], capture_output=True, text=True
    )
    after = shutil.disk_usage(tmp_path).free
    assert done.returncode == 0, done.stderr
    # between the two readings (the disk is shared with whatever else runs), give or take a little
    margin = 64 * 1024**2
    assert min(before, after) - margin <= int(done.stdout) <= max(before, after) + margin


def test_another_registry_digest_stops_verify_naming_both() -> None:
    """NEW pulled another image than the one the site's lock recorded at the push."""
    old = copy.deepcopy(OLD)
    old["golden"]["identity"]["image_digest"] = "sha256:" + "1" * 64
    new = _new(**{"golden.identity.image_digest": "sha256:" + "2" * 64})
    diffs = {d.what: d for d in compare.compare(old, new, decode_rate_tolerance=0.25).differences}
    assert (diffs["identity: image_digest"].old, diffs["identity: image_digest"].new) == (
        "sha256:" + "1" * 64,
        "sha256:" + "2" * 64,
    )


def test_an_identity_field_old_s_older_cli_did_not_record_is_not_compared_and_keys_are_unchanged() -> None:
    """Upgrading the CLI adds `image_digest` to the identity: an OLD verified before it still moves
    (the digest is in `lock_sha256` anyway), and its goldens keep their keys."""
    from specdeploy.gate import golden

    old = copy.deepcopy(OLD)
    old["golden"]["identity"].pop("image_digest", None)
    new = _new(**{"golden.identity.image_digest": "sha256:" + "4" * 64})
    result = compare.compare(old, new, decode_rate_tolerance=0.25)
    line = next(x for x in result.lines if x.what == "identity: image_digest")
    assert line.same is None and "predates" in line.note and result.same
    identity = dict(OLD["golden"]["identity"])
    assert golden.key({**identity, "image_digest": "sha256:" + "4" * 64}) == golden.key(identity)


def test_seeding_new_from_itself_is_refused_before_any_host_is_reached(cli: Any, tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[rehearsal]\nold-host\nnew-host\n")
    done = cli("migrate", "prepare", "--from", "old-host", "--to", "new-host", "-i", inventory,
               "--seed-from", "new-host")  # fmt: skip
    assert done.exit_code == 2 and "--seed-from names NEW itself (new-host)" in done.stderr


def test_a_host_s_inventory_variables_never_show_in_its_repr_or_json() -> None:
    """HostAccess keeps the inventory's variables (read once, for the layout and the image source);
    vault-decrypted values among them must not reach a log or a traceback."""
    from specdeploy.migrate.hosts import HostAccess

    secret = "sk-CANARY-hostvars-0002"
    host = HostAccess("new-host", "127.0.0.1", 22, "root", None, "10.0.0.2", True, {"engine_api_key": secret})
    assert host.variables["engine_api_key"] == secret
    assert secret not in repr(host) and secret not in json.dumps(host.to_json())


# --------------------------------------------------------------------------- a site's own balancer


def _hook_cutover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fronts: list[str]) -> tuple[Any, Any, Any, Path]:
    """`migrate cutover` through the site's own balancer on the front hosts `fronts` (each this machine,
    reached through invoke's local context, the runner Fabric's SSH connection extends): the real
    `specdeploy front` CLI there calls the hook, which writes each call to a file. Returns the
    migration, its record, the cutover's details and the calls file."""
    import shutil

    import invoke

    from specdeploy.migrate import steps
    from specdeploy.migrate.hosts import HostAccess
    from specdeploy.profile import resolve_profile_path

    calls = tmp_path / "calls"
    hook = tmp_path / "site-balancer"
    hook.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'if [ "$1" = status ]; then\n'
        '  echo \'[{"name": "old", "state": "maint"}, {"name": "new", "state": "ready"}]\'\nfi\n'
    )
    hook.chmod(0o755)
    monkeypatch.setattr(steps, "CLI", str(Path(sys.executable).parent / "specdeploy"))

    def access(name: str) -> HostAccess:
        return HostAccess(name, "127.0.0.1", 22, None, None, "127.0.0.1", False)

    m = steps.Migration(
        site=tmp_path, inventory=tmp_path / "hosts.ini", old=access("old"), new=access("new"),
        front=access(fronts[0]), other_fronts=[access(name) for name in fronts[1:]], front_hook=str(hook),
    )  # fmt: skip
    for name in fronts:
        m._connections[name] = invoke.Context()
    rec = record.MigrationRecord(old="old", new="new")
    rec.profile = "cpu-rehearsal"
    (m.workdir / "profiles").mkdir(parents=True)
    shutil.copy(resolve_profile_path("cpu-rehearsal"), m.workdir / "profiles" / "cpu-rehearsal.yaml")
    return m, rec, steps.cutover(m, rec), calls


def test_cutover_through_a_site_hook_calls_add_drain_remove_and_counts_no_front_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`migrate cutover` with the site's own balancer (`--front-hook`, or the front host's `front_hook`):
    the real `specdeploy front` CLI on the "front host" calls the hook: add NEW, drain OLD, remove
    OLD, in that order. Traffic is then on NEW; the failed requests are not counted (None, never a
    0 nobody measured): the hook's balancer keeps its own."""
    from specdeploy.migrate import steps

    m, rec, details, calls = _hook_cutover(tmp_path, monkeypatch, ["front"])
    assert [line for line in calls.read_text().splitlines() if line != "status"] == [
        "add new", "drain old", "remove old"
    ]  # fmt: skip
    assert [s["step"] for s in details["steps"]] == ["enable", "drain", "disable"]
    assert details["failed_requests_at_front"] is None and rec.traffic_on == "new"
    assert steps.front_door(m) == ["--hook", m.front_hook]
    m.front_hook = None
    assert steps.front_door(m) == []  # HAProxy's socket: the front's own default
    m.front_socket = "/run/site/admin.sock"
    assert steps.front_door(m) == ["--socket", "/run/site/admin.sock"]


def test_a_cutover_with_two_front_hosts_moves_traffic_on_both_and_drains_old_on_both_before_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: a site with two front hosts (`--front A --front B`): every move is made on each, in
    order; OLD is drained on both before either waits for its requests in flight (a front still
    sending to OLD while the other waits would keep OLD busy); the move's steps name the front each
    was made on."""
    _, rec, details, calls = _hook_cutover(tmp_path, monkeypatch, ["front-a", "front-b"])
    moves = [line for line in calls.read_text().splitlines() if line != "status"]
    assert moves == [
        "add new", "add new",
        "drain old", "drain old",  # both fronts stop sending to OLD ...
        "drain old", "drain old",  # ... then each waits for its own in flight
        "remove old", "remove old",
    ], moves  # fmt: skip
    assert [(s["step"], s["front"]) for s in details["steps"]] == [
        ("enable", "front-a"), ("enable", "front-b"), ("drain", "front-a"), ("drain", "front-b"),
        ("disable", "front-a"), ("disable", "front-b"),
    ]  # fmt: skip
    assert rec.traffic_on == "new" and details["failed_requests_at_front"] is None


def test_the_same_front_named_twice_or_an_engine_host_as_a_front_is_refused(cli: Any, tmp_path: Path) -> None:
    for fronts in (["front", "front"], ["front", "new"]):
        argv = [a for name in fronts for a in ("--front", name)]
        result = cli("migrate", "cutover", "--from", "old", "--to", "new", "-i", tmp_path / "absent.ini", *argv)
        assert result.exit_code == 2 and "expected distinct front hosts" in result.output, result.output


def test_a_socket_and_a_hook_together_are_refused_before_anything_is_read(cli: Any, tmp_path: Path) -> None:
    result = cli(
        "migrate", "cutover", "--from", "old", "--to", "new", "-i", tmp_path / "absent.ini", "--front", "front",
        "--socket", "/run/haproxy/admin.sock", "--front-hook", "/usr/local/sbin/site-balancer",
    )  # fmt: skip
    assert result.exit_code == 2 and "name two balancers: expected one" in result.output, result.output
    assert not (tmp_path / "migrations").exists()


def _local_migration(tmp_path: Path) -> Any:
    """A migration whose OLD and NEW are this machine, reached through invoke's local context (the
    runner Fabric's SSH connection extends), each with a state directory of its own under tmp_path."""
    import invoke

    from specdeploy.migrate import steps
    from specdeploy.migrate.hosts import HostAccess

    def access(name: str) -> HostAccess:
        state = {"specdeploy_state_dir": str(tmp_path / f"{name}-state")}
        return HostAccess(name, "127.0.0.1", 22, None, None, "127.0.0.1", False, variables=state)

    m = steps.Migration(site=tmp_path, inventory=tmp_path / "hosts.ini", old=access("old"), new=access("new"))
    m._connections.update(old=invoke.Context(), new=invoke.Context())
    return m


def test_plan_refuses_an_old_host_with_no_verified_gate_report_before_anything_is_copied(tmp_path: Path) -> None:
    """Both hosts answer (real commands, run here), but OLD's state layout has no verified run: plan
    stops naming the report's path, and nothing is read or written for the move."""
    from specdeploy.migrate import steps

    m = _local_migration(tmp_path)
    with pytest.raises(SpecdeployError) as caught:
        steps.plan(m, record.MigrationRecord(old="old", new="new"))
    assert f"old: no verified gate report at {tmp_path}/old-state/verified/gate.json" in caught.value.message
    assert "deploy.yml -l old" in (caught.value.hint or "")
    assert not (m.workdir / "profiles").exists() and not (m.workdir / "old-verified-gate.json").exists()


def test_plan_refuses_an_old_host_that_serves_another_identity_than_its_gate_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OLD's verified report passed identity `aaa…`; its served identity is now `bbb…` (a stand-in
    for the host's `specdeploy served-identity`, which needs a running engine): plan refuses, naming
    both, because the report no longer proves what OLD serves."""
    from specdeploy.migrate import steps

    m = _local_migration(tmp_path)
    verified = tmp_path / "old-state" / "verified"
    verified.mkdir(parents=True)
    report = {"verdict": "pass", "run_id": "r1", "profile_file": str(tmp_path / "p.yaml"), "golden": {"key": "a" * 16}}
    (verified / "gate.json").write_text(json.dumps(report))
    identity = tmp_path / "served-identity"
    identity.write_text(f"#!/bin/sh\necho '{json.dumps({'key': 'b' * 16})}'\n")
    identity.chmod(0o755)
    monkeypatch.setattr(steps, "CLI", str(identity))
    with pytest.raises(SpecdeployError) as caught:
        steps.plan(m, record.MigrationRecord(old="old", new="new"))
    message = caught.value.message
    assert f"identity {'b' * 16}" in message and f"identity {'a' * 16}" in message
    assert "the stack changed since its gate" in message and "deploy.yml -l old" in (caught.value.hint or "")
    assert not (m.workdir / "old-verified-gate.json").exists()


def test_plan_names_each_pin_and_lock_entry_the_site_s_lock_would_not_give_new_as_old_serves_it(
    tmp_path: Path,
) -> None:
    """prepare deploys NEW with the site's lock: where it no longer holds what OLD's own lock (its
    state layout's) holds for the profile, NEW would resolve other values than OLD serves, found
    only at verify after the whole copy. plan names each entry and pin, both values."""
    from specdeploy.migrate import steps
    from specdeploy.profile import load_profile, site_lock
    from specdeploy.profile.lock import Lock

    profile = load_profile("cpu-rehearsal-container")
    name = profile.name

    def lock(file: str, **entries: str) -> Lock:
        made = Lock(tmp_path / file)
        for key, value in entries.items():
            made.record(name, key, value, by="test")
        site_lock._take_snapshot(made, profile, by="test")
        return made

    old = lock("old.lock", image_digest="sha256:" + "a" * 64, config_sha="c" * 64)
    assert steps.lock_problems(lock("same.lock", image_digest="sha256:" + "a" * 64, config_sha="c" * 64, extra="x"),
                               old, profile, old_name="old") == []  # fmt: skip
    assert steps.lock_problems(old, None, profile, old_name="old") == [
        "old has no lock in its state layout: nothing shows which pins it serves"
    ]
    moved = lock("moved.lock", image_digest="sha256:" + "b" * 64)
    moved.data["pins"][name]["values"]["engine.source.version"] = "0.99.0"  # a `lock update` since OLD's deploy
    problems = steps.lock_problems(moved, old, profile, old_name="old")
    assert problems[0].startswith("pin engine.source.version: OLD's profile has ") and "now for '0.99.0'" in problems[0]
    assert f"{name}/config_sha: OLD serves '{'c' * 64}', the site's lock has no entry" in problems
    assert f"{name}/image_digest: OLD serves 'sha256:{'a' * 64}', the site's lock has 'sha256:{'b' * 64}'" in problems
    assert len(problems) == 3
