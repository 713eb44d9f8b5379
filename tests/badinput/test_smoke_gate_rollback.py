"""Bad input to `smoke`, `gate`, `rollback restore` and `rollback recover` (issue 20: D2, D5,
D7, D8, D16).

Each case runs the real CLI the way a user (or the deploy's roles) does, against a small
loopback stub of a vLLM server (http.server on 127.0.0.1, an ephemeral port, a daemon thread,
shut down by its fixture) that answers like vLLM except where a case makes it answer badly: an
HTML page, a list where an object belongs, a chat answer without `choices`, garbage at
`/metrics`. It checks what docs/commands.md's bad-input table promises: the exit code ("could not
test" is 2 on every such path), the endpoint, field or file named, the fix, no traceback; that
the --json report / gate.json / restore.json says the same as the exit code and never keeps an
earlier verdict; and, where nothing may change, every file byte-identical. Inputs that could
hang (a FIFO) run as a subprocess with a deadline; readiness timeouts are passed short.

No case reaches systemctl: restores that would restart an engine are not run here (the unit
tests record systemctl instead).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.badinput import (
    FAST,
    MODEL,
    NOT_AN_ENGINE_FIX,
    RESCORE,
    STREAM,
    Engine,
    Run,
    Snapshot,
    _chat,
    _metrics,
    _variant,
    no_systemctl,  # noqa: F401  an autouse fixture
    write,
)

from specdeploy.rehearsal import variants

CLOSED = "http://127.0.0.1:9"  # nothing listens on the discard port: refused in milliseconds

# --------------------------------------------------------------------------- a vLLM stub


METRICS = _metrics(1)
HTML = "<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body>It works</body></html>"


@pytest.fixture
def silent() -> Iterator[str]:
    """A port that accepts connections and never answers: every request hangs until its timeout."""
    sock = socket.create_server(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _stage(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["stages"] if s["name"] == name)


# --------------------------------------------------------------------------- smoke: D2


# (id, route, bad answer, stage that could not test, words the message names)
BAD_BODIES = [
    ("models-html", "GET /v1/models", (200, HTML), "readiness", ["/v1/models", "expected a JSON body", "nginx"]),
    ("models-list", "GET /v1/models", (200, [{"id": MODEL}]), "readiness", ["/v1/models", "a list of 1"]),
    ("models-no-id", "GET /v1/models", (200, {"data": [{"name": MODEL}]}), "readiness", ["data[0]", "'id'"]),
    ("models-empty-body", "GET /v1/models", (200, ""), "readiness", ["/v1/models", "an empty body"]),
    ("version-html", "GET /version", (200, HTML), "identity", ["/version", "expected a JSON body"]),
    ("version-list", "GET /version", (200, ["0.32.0"]), "identity", ["/version", "expected a JSON object"]),
    ("chat-no-choices", "POST /v1/chat/completions", (200, {"object": "error"}), "coherence", ["'choices'"]),
    ("chat-empty-choices", "POST /v1/chat/completions", (200, {"choices": []}), "coherence", ["empty list"]),
    (
        "chat-message-null",
        "POST /v1/chat/completions",
        (200, {"choices": [{"message": None, "finish_reason": "stop"}]}),
        "coherence",
        ["choices[0]", "'message'"],
    ),
    (
        "chat-content-number",
        "POST /v1/chat/completions",
        (200, {"choices": [{"message": {"content": 42}, "finish_reason": "stop"}]}),
        "coherence",
        ["'content'", "a number (42)"],
    ),
    (
        "chat-usage-not-a-count",
        "POST /v1/chat/completions",
        (200, _chat("Paris") | {"usage": {"completion_tokens": "many"}}),
        "coherence",
        ["'completion_tokens'", "'many'"],
    ),
    ("chat-html", "POST /v1/chat/completions", (200, HTML), "coherence", ["/v1/chat/completions", "nginx"]),
    # /metrics is first read by identity (the served k: the per-position counter's positions)
    ("metrics-garbage", "GET /metrics", (200, "this is not prometheus\n{{{"), "identity", ["/metrics", "Prometheus"]),
    ("metrics-html", "GET /metrics", (200, HTML), "identity", ["/metrics", "expected Prometheus text"]),
    (
        "metrics-position-not-a-number",
        "GET /metrics",
        (200, METRICS.replace('position="2"', 'position="last"')),
        "identity",
        ["position", "last"],
    ),
    (
        "rescore-without-prompt-logprobs",
        RESCORE,
        (200, {"choices": [{"text": "", "finish_reason": "length"}], "usage": {"prompt_tokens": 9}}),
        "lossless",
        ["/v1/completions (prompt_logprobs)", "'prompt_logprobs'"],
    ),
    (
        "completion-no-usage",
        "POST /v1/completions",
        (200, {"choices": [{"text": " jumps", "finish_reason": "length"}]}),
        "acceptance",
        ["/v1/completions", "'usage'"],
    ),
]


@pytest.mark.parametrize(
    ("route", "bad", "stage", "names"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
def test_a_200_answer_with_an_unexpected_body_is_could_not_test_with_a_report(
    run: Run, serve: Callable[..., str], tmp_path: Path, route: str, bad: tuple[int, Any], stage: str, names: list[str]
) -> None:
    """D2: was a KeyError/JSONDecodeError/AttributeError traceback (exit 70) and no report."""
    endpoint = serve(Engine({route: bad}))
    report = tmp_path / "smoke.json"
    answer = run("smoke", "--profile", "cpu-rehearsal", "--endpoint", endpoint, "--json", report, *FAST)
    answer.expect(2, *names, "could not test", fix=NOT_AN_ENGINE_FIX)
    on_disk = _report(report)
    assert on_disk["verdict"] == "error" and on_disk["exit_code"] == 2, on_disk
    assert _stage(on_disk, stage)["status"] == "error", on_disk["stages"]
    assert "verdict: error (exit 2)" in answer.stdout


def test_a_stream_chunk_that_is_not_json_is_could_not_test(run: Run, serve: Callable[..., str], tmp_path: Path) -> None:
    """D2: a streamed completion's `data:` line that is not JSON (a proxy's error page mid-stream)."""
    endpoint = serve(Engine(stream=[*STREAM[:2], "<html>502 Bad Gateway</html>"]))
    report = tmp_path / "smoke.json"
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", endpoint, "--json", report, *FAST).expect(
        2, "/v1/completions (stream)", "502 Bad Gateway", fix=NOT_AN_ENGINE_FIX
    )
    assert _stage(_report(report), "throughput")["status"] == "error"


def test_an_earlier_pass_report_never_survives_a_run_that_could_not_test(
    run: Run, serve: Callable[..., str], tmp_path: Path
) -> None:
    """D2: the previous run's "pass" stayed where the role reads it when the next smoke crashed."""
    report = write(tmp_path / "smoke.json", json.dumps({"verdict": "pass", "exit_code": 0, "stages": []}))
    endpoint = serve(Engine({"POST /v1/chat/completions": (200, {"object": "error"})}))
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", endpoint, "--json", report, *FAST).expect(
        2, "'choices'", fix=NOT_AN_ENGINE_FIX
    )
    assert _report(report)["verdict"] == "error"


# --------------------------------------------------------------------------- smoke: D5


def test_a_refused_connection_is_named_as_the_reason(run: Run, tmp_path: Path) -> None:
    report = tmp_path / "smoke.json"
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", CLOSED, "--json", report, *FAST).expect(
        2, "connection refused", "127.0.0.1:9/health", fix="start the engine or correct --endpoint"
    )
    assert "connection refused" in _stage(_report(report), "readiness")["summary"]


def test_a_server_error_is_named_with_its_status_and_first_bytes(run: Run, serve: Callable[..., str]) -> None:
    endpoint = serve(Engine({"GET /health": (500, "engine core died: CUDA out of memory")}))
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", endpoint, *FAST).expect(
        2, "HTTP 500", "CUDA out of memory", fix="start the engine or correct --endpoint"
    )


def test_a_server_that_never_answers_times_out_within_the_readiness_timeout(run: Run, silent: str) -> None:
    """D5: each probe waited 5 s whatever the timeout left, and the reason was "no answer yet"."""
    answer = run("smoke", "--profile", "cpu-rehearsal", "--endpoint", silent, "--readiness-timeout", "1")
    answer.expect(2, "no answer in time", "/health", fix="start the engine or correct --endpoint")


def test_readiness_asks_the_engine_at_least_once_however_short_its_timeout(
    run: Run, serve: Callable[..., str], tmp_path: Path
) -> None:
    """On a loaded machine, building the HTTP client and the progress line outlasted a 1 s timeout
    and the smoke said "not ready within 1s; last: no answer yet" of a stub serving all along."""
    report = tmp_path / "smoke.json"
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(), "--json", report, "--readiness-timeout", "0.001")
    readiness = _stage(_report(report), "readiness")
    assert readiness["status"] == "pass", readiness


def test_a_wrong_model_name_names_what_is_served(run: Run, serve: Callable[..., str]) -> None:
    endpoint = serve(Engine({"GET /v1/models": (200, {"data": [{"id": "other-model"}]})}))
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", endpoint, *FAST).expect(
        2, "['other-model']", MODEL, fix="served_model_name"
    )


MALFORMED_URLS = [
    ("no-scheme", "127.0.0.1:{port}", "has no scheme"),
    ("ends-in-v1", "http://127.0.0.1:{port}/v1", "ends in /v1"),
    ("ends-in-v1-slash", "http://127.0.0.1:{port}/v1/", "ends in /v1"),
    ("ftp-scheme", "ftp://127.0.0.1:{port}", "has the scheme ftp://"),
    ("bad-ipv6", "http://[::1", "is not a valid URL"),
    ("empty", "", "is empty"),
]


@pytest.mark.parametrize(("url", "problem"), [m[1:] for m in MALFORMED_URLS], ids=[m[0] for m in MALFORMED_URLS])
def test_a_malformed_endpoint_fails_at_once_naming_the_problem(
    run: Run, serve: Callable[..., str], tmp_path: Path, url: str, problem: str
) -> None:
    """D5: a URL without a scheme or ending in /v1 waited the whole readiness timeout ("not
    ready within 6s"; 30 minutes with the GPU profiles); an invalid one was a traceback."""
    port = serve().rsplit(":", 1)[1]
    report = tmp_path / "smoke.json"
    start = time.monotonic()
    answer = run(
        "smoke", "--profile", "cpu-rehearsal", "--endpoint", url.format(port=port), "--json", report,
        "--readiness-timeout", "60",
    )  # fmt: skip
    assert time.monotonic() - start < 30, "a malformed URL must not wait for the readiness timeout"
    answer.expect(2, "--endpoint", problem, fix="pass the engine's base URL, e.g. http://127.0.0.1:8100")
    assert _report(report)["verdict"] == "error"


def test_a_readiness_timeout_that_is_not_positive_is_a_usage_error(run: Run, tmp_path: Path) -> None:
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", CLOSED, "--readiness-timeout", "-1").expect(
        2, "--readiness-timeout", "-1", fix="positive number of seconds"
    )


# --------------------------------------------------------------------------- smoke: D8


def _golden(tmp_path: Path, content: str | bytes) -> Path:
    return write(tmp_path / "golden.json", content)


GOLDENS = [
    ("not-json", b'{"outputs": {"What is 6 times 7?": "42"', ["not valid JSON"], "fix the golden transcript"),
    ("a-list", b'[{"outputs": {}}]', ["expected a JSON object", "list"], "right file"),
    ("no-outputs", b'{"profile": "cpu-rehearsal"}', ["field outputs", "no such field"], "--record-golden"),
    ("empty-outputs", b'{"outputs": {}}', ["field outputs", "an empty object"], "--record-golden"),
    ("outputs-a-list", b'{"outputs": ["42"]}', ["field outputs", "list"], "--record-golden"),
    ("output-not-text", b'{"outputs": {"What is 6 times 7?": 42}}', ["outputs['What is 6 times 7?']", "int"],
     "--record-golden"),
    ("not-utf8", b'{"outputs": {"\xff\xfe": "x"}}', ["not UTF-8"], "as UTF-8"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "names", "fix"), [g[1:] for g in GOLDENS], ids=[g[0] for g in GOLDENS])
def test_a_corrupt_golden_file_is_refused_before_any_stage_runs(
    run: Run, serve: Callable[..., str], tmp_path: Path, content: bytes, names: list[str], fix: str
) -> None:
    """D8: the golden file was read after readiness, identity and coherence ran, then crashed."""
    engine = Engine()
    golden = _golden(tmp_path, content)
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(engine), "--golden", golden, *FAST).expect(
        2, "golden transcript", str(golden), *names, fix=fix
    )
    assert engine.seen == [], "no stage may run before the golden transcript is read"


def test_a_missing_golden_file_is_refused_before_any_stage_runs(
    run: Run, serve: Callable[..., str], tmp_path: Path
) -> None:
    engine = Engine()
    missing = tmp_path / "no-such-golden.json"
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(engine), "--golden", missing, *FAST).expect(
        2, str(missing), "does not exist", fix="--record-golden"
    )
    assert engine.seen == []


def test_a_golden_fifo_is_refused_at_once_not_read_forever(
    run_process: Run, serve: Callable[..., str], tmp_path: Path
) -> None:
    """D8/D14: a FIFO passed the option's exists check and blocked the golden stage forever."""
    fifo = tmp_path / "golden.json"
    os.mkfifo(fifo)
    engine = Engine()
    run_process("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(engine), "--golden", fifo, *FAST).expect(
        2, str(fifo), "FIFO", fix="recorded with `specdeploy smoke --record-golden PATH`"
    )
    assert engine.seen == []


# --------------------------------------------------------------------------- smoke: D16


UNWRITABLE = [
    ("missing-directory", lambda tmp: tmp / "no-such-dir" / "smoke.json", "does not exist"),
    ("a-directory", lambda tmp: (tmp / "reports").mkdir() or tmp / "reports", "is a directory"),
    ("under-a-file", lambda tmp: write(tmp / "file", "x") / "smoke.json", "not a directory"),
]


@pytest.mark.parametrize(("where", "problem"), [u[1:] for u in UNWRITABLE], ids=[u[0] for u in UNWRITABLE])
def test_an_unwritable_json_path_fails_before_the_smoke_runs(
    run: Run, serve: Callable[..., str], tmp_path: Path, where: Callable[[Path], Path], problem: str
) -> None:
    """D16: the smoke ran, printed its verdict "(exit N)", then exited 1 on the write."""
    engine = Engine()
    target = where(tmp_path)
    before = Snapshot(tmp_path)
    answer = run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(engine), "--json", target, *FAST)
    answer.expect(2, "--json", str(target), problem, fix="writable directory")
    assert "verdict:" not in answer.stdout and engine.seen == []
    before.unchanged()


def test_an_unwritable_record_golden_path_fails_before_the_smoke_runs(
    run: Run, serve: Callable[..., str], tmp_path: Path
) -> None:
    engine = Engine()
    target = write(tmp_path / "file", "x") / "golden.json"
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(engine), "--record-golden", target, *FAST).expect(
        2, "--record-golden", str(target), fix="writable directory"
    )
    assert engine.seen == []


# --------------------------------------------------------------------------- gate


@pytest.fixture
def slow_profile(tmp_path: Path) -> Path:
    """cpu-rehearsal with a 60 s readiness timeout: a case that must not wait for it answers in a
    fraction of it (a margin no loaded machine eats; speed itself is not what is asserted)."""
    return _variant(tmp_path, "cpu-rehearsal-slow", 60)


def _gate(run: Run, profile: Path, state: Path, endpoint: str, *extra: object, run_id: str = "r1") -> Any:
    return run("gate", "--profile", profile, "--state-dir", state, "--run-id", run_id, "--endpoint", endpoint, *extra)


GATE_BODIES = [b for b in BAD_BODIES if b[0] in ("models-html", "chat-no-choices", "metrics-garbage", "version-list")]


@pytest.mark.parametrize(
    ("route", "bad", "stage", "names"), [b[1:] for b in GATE_BODIES], ids=[b[0] for b in GATE_BODIES]
)
def test_the_gate_reports_an_unexpected_body_as_could_not_test_and_rolls_back(
    run: Run,
    serve: Callable[..., str],
    tmp_path: Path,
    quick_profile: Path,
    route: str,
    bad: tuple[int, Any],
    stage: str,
    names: list[str],
) -> None:
    """D2: the smoke's crash was "the gate itself failed" (exit 70), and no rollback ran."""
    state = tmp_path / "state"
    answer = _gate(run, quick_profile, state, serve(Engine({route: bad})))
    answer.expect(2, *names, fix=NOT_AN_ENGINE_FIX)
    report = _report(state / "runs" / "r1" / "gate.json")
    assert report["verdict"] == "error" and report["exit_code"] == 2
    assert _stage(report["smoke"], stage)["status"] == "error"
    assert "replaced nothing" in report["rollback"]["message"]  # the rollback ran (this run replaced nothing)
    assert not (state / "verified").exists()


@pytest.mark.parametrize(
    ("url", "problem"),
    [("127.0.0.1:8100", "has no scheme"), ("http://127.0.0.1:8100/v1", "ends in /v1")],
    ids=["no-scheme", "ends-in-v1"],
)
def test_the_gate_fails_at_once_on_a_malformed_endpoint(
    run: Run, tmp_path: Path, slow_profile: Path, url: str, problem: str
) -> None:
    """D5: waited the profile's whole readiness timeout, then "not ready"."""
    state = tmp_path / "state"
    start = time.monotonic()
    answer = _gate(run, slow_profile, state, url)
    assert time.monotonic() - start < 30, "a malformed URL must not wait for the readiness timeout"
    answer.expect(2, "--endpoint", problem, fix="base URL")
    report = _report(state / "runs" / "r1" / "gate.json")
    assert report["verdict"] == "error" and problem in report["smoke"]["stages"][0]["summary"]


def test_the_gate_names_a_refused_connection(run: Run, tmp_path: Path, quick_profile: Path) -> None:
    state = tmp_path / "state"
    _gate(run, quick_profile, state, CLOSED).expect(2, "connection refused", fix="correct --endpoint")
    assert "connection refused" in _report(state / "runs" / "r1" / "gate.json")["smoke"]["stages"][0]["summary"]


@pytest.mark.parametrize("run_id", ["../escape", ".hidden", "a/b"], ids=["parent", "dot", "slash"])
def test_a_run_id_that_is_not_a_plain_name_is_a_usage_error_that_changes_nothing(
    run: Run, tmp_path: Path, quick_profile: Path, run_id: str
) -> None:
    state = tmp_path / "state"
    (state / "runs").mkdir(parents=True)
    before = Snapshot(tmp_path)
    _gate(run, quick_profile, state, CLOSED, run_id=run_id).expect(
        2, "--run-id", run_id, fix="use letters, digits, '-', '_' or '.'"
    )
    before.unchanged()


def test_a_run_id_already_gated_is_refused_and_its_report_kept(run: Run, tmp_path: Path, quick_profile: Path) -> None:
    state = tmp_path / "state"
    write(state / "runs" / "r1" / "gate.json", '{"verdict": "pass"}\n')
    before = Snapshot(tmp_path)
    _gate(run, quick_profile, state, CLOSED).expect(1, "already has a gate report", fix="new --run-id")
    before.unchanged()


def test_a_state_dir_that_is_a_file_is_a_usage_error_that_changes_nothing(
    run: Run, tmp_path: Path, quick_profile: Path
) -> None:
    """Was exit 1 with "free space or remount" (D17's wrong hint) for a path that is a file."""
    state = write(tmp_path / "state", "not a directory\n")
    before = Snapshot(tmp_path)
    _gate(run, quick_profile, state, CLOSED).expect(2, "--state-dir", str(state), "found a file", fix="state directory")
    before.unchanged()


def test_a_startup_log_fifo_is_refused_at_once(run_process: Run, tmp_path: Path) -> None:
    """A FIFO passed the option's exists check and blocked the DFlash startup-log check forever."""
    profile = variants.materialize(variants.dflash(), tmp_path / "profiles")
    fifo = tmp_path / "engine.log"
    os.mkfifo(fifo)
    state = tmp_path / "state"
    answer = run_process(
        "gate", "--profile", profile, "--state-dir", state, "--run-id", "r1", "--endpoint", CLOSED,
        "--startup-log", fifo,
    )  # fmt: skip
    answer.expect(2, "startup log", str(fifo), "FIFO", fix="saved engine log")
    report = _report(state / "runs" / "r1" / "gate.json")
    assert report["verdict"] == "error" and report["exit_code"] == 2


def test_a_missing_startup_log_is_refused_naming_it(run: Run, tmp_path: Path, quick_profile: Path) -> None:
    missing = tmp_path / "no-such.log"
    state = tmp_path / "state"
    _gate(run, quick_profile, state, CLOSED, "--startup-log", missing).expect(
        2, "startup log", str(missing), "does not exist", fix="saved engine log"
    )
    assert _report(state / "runs" / "r1" / "gate.json")["exit_code"] == 2


def test_a_gate_readiness_timeout_that_is_not_positive_is_a_usage_error(
    run: Run, tmp_path: Path, quick_profile: Path
) -> None:
    state = tmp_path / "state"
    _gate(run, quick_profile, state, CLOSED, "--readiness-timeout", "-5").expect(
        2, "--readiness-timeout", fix="positive number of seconds"
    )
    assert not state.exists()


def test_a_truncated_rollback_record_fails_the_gates_rollback_clearly_and_touches_nothing(
    run: Run, tmp_path: Path, quick_profile: Path
) -> None:
    state = tmp_path / "state"
    serving = write(tmp_path / "serving" / "drafter" / "config.json", '{"new": true}\n').parent
    write(state / "rollback" / "run.json", '{"run_id": "r1", "entries": [{"path": "' + str(serving))
    before = Snapshot(serving, state / "rollback")
    _gate(run, quick_profile, state, CLOSED).expect(
        4, "rollback run record", "run.json", "not valid JSON", fix="`specdeploy rollback restore --run-id r1`"
    )
    before.unchanged()
    assert "not valid JSON" in _report(state / "runs" / "r1" / "gate.json")["rollback"]["error"]


# --------------------------------------------------------------------------- rollback restore


def _record(state: Path, run_id: str, entries: list[dict[str, Any]], closed: str | None = None) -> Path:
    return write(
        state / "rollback" / "run.json", json.dumps({"run_id": run_id, "closed": closed, "entries": entries}) + "\n"
    )


def _kept_dir(state: Path, n: int, config: str) -> Path:
    return write(state / "rollback" / "copies" / str(n) / "config.json", config).parent


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A state directory whose rollback record belongs to run `deploy-1` (still open): it replaced
    the drafter's serving directory, kept in copies/0."""
    state = tmp_path / "state"
    serving = write(tmp_path / "serving" / "drafter" / "config.json", '{"failed": "run"}\n').parent
    _kept_dir(state, 0, '{"good": "stack"}\n')
    _record(
        state,
        "deploy-1",
        [{"path": str(serving), "kind": "dir", "saved_at": 1.0, "copy": str(state / "rollback" / "copies" / "0")}],
    )
    return {"state": state, "serving": serving}


def test_restore_with_a_state_dir_that_does_not_exist_is_an_error_not_replaced_nothing(
    run: Run, tmp_path: Path
) -> None:
    """D7: answered "replaced nothing" (exit 0), which the play reads as nothing to do."""
    missing = tmp_path / "no-such-state"
    run("rollback", "restore", "--run-id", "deploy-1", "--state-dir", missing).expect(
        2, "--state-dir", str(missing), "does not exist", fix="specdeploy facts"
    )
    assert not missing.exists()


def test_restore_with_a_state_dir_that_is_a_file_is_an_error(run: Run, tmp_path: Path) -> None:
    state = write(tmp_path / "state", "x")
    before = Snapshot(tmp_path)
    run("rollback", "restore", "--run-id", "deploy-1", "--state-dir", state).expect(
        2, "--state-dir", "found a file", fix="specdeploy facts"
    )
    before.unchanged()


def test_restore_of_an_unknown_run_id_names_the_runs_the_host_knows(
    run: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    """D7: a typo in --run-id was "replaced nothing", exit 0."""
    before = Snapshot(tmp_path)
    run("rollback", "restore", "--run-id", "deploy-l", "--state-dir", host["state"]).expect(
        2, "run deploy-l is unknown", "deploy-1's", fix="known here: deploy-1"
    )
    before.unchanged()


def test_restore_of_an_unknown_run_id_on_an_empty_state_dir_is_an_error(run: Run, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    before = Snapshot(tmp_path)
    run("rollback", "restore", "--run-id", "deploy-1", "--state-dir", state).expect(
        2, "run deploy-1 is unknown", "no rollback record", fix="--run-id"
    )
    before.unchanged()


BAD_RECORDS = [
    ("truncated", b'{"run_id": "deploy-1", "entries": [{"path": "/srv', ["not valid JSON", "line 1"]),
    ("a-list", b'[{"run_id": "deploy-1"}]', ["expected a JSON object", "list"]),
    ("no-entries", b'{"run_id": "deploy-1"}', ["entries", "expected a list", "NoneType"]),
    ("entry-without-kind", b'{"run_id": "deploy-1", "entries": [{"path": "/srv/x", "saved_at": 1, "copy": "/c"}]}',
     ["entries[0].kind", "None"]),
    ("not-utf8", b'{"run_id": "deploy-\xff", "entries": []}', ["not UTF-8", "0xff"]),
    ("run-id-escapes", b'{"run_id": "../../etc", "entries": []}', ["run_id", "../../etc"]),
]  # fmt: skip


@pytest.mark.parametrize(("content", "names"), [r[1:] for r in BAD_RECORDS], ids=[r[0] for r in BAD_RECORDS])
def test_restore_with_a_damaged_run_record_is_a_clear_error_that_touches_nothing(
    run: Run, tmp_path: Path, host: dict[str, Path], content: bytes, names: list[str]
) -> None:
    """D7: a truncated record (or one of another shape) was a traceback."""
    write(host["state"] / "rollback" / "run.json", content)
    before = Snapshot(tmp_path)
    run("rollback", "restore", "--run-id", "deploy-1", "--state-dir", host["state"]).expect(
        2, "rollback run record", "run.json", *names, fix="move run.json aside"
    )
    before.unchanged()


def test_restore_with_a_run_record_that_is_a_fifo_is_refused_at_once(
    run_process: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    """Was "replaced nothing" (a FIFO is not a regular file), exit 0: the copies were never restored."""
    record = host["state"] / "rollback" / "run.json"
    record.unlink()
    os.mkfifo(record)
    run_process("rollback", "restore", "--run-id", "deploy-1", "--state-dir", host["state"]).expect(
        2, "rollback run record", "FIFO", fix="move run.json aside"
    )
    assert (host["serving"] / "config.json").read_text() == '{"failed": "run"}\n'


def test_a_restore_whose_copy_back_fails_leaves_the_path_in_place_and_says_what_was_not_restored(
    run: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    """D2: the failed run's version was moved aside before the copy-back, which then failed: the
    serving directory was gone, and the answer a traceback."""
    state, serving = host["state"], host["serving"]
    kept_unit = write(state / "rollback" / "copies" / "1", "[Service]\nExecStart=/old\n")
    unit = write(tmp_path / "etc" / "engine.service", "[Service]\nExecStart=/new\n")
    _record(state, "deploy-1", [
        {"path": str(unit), "kind": "file", "saved_at": 1.0, "copy": str(kept_unit)},
        {"path": str(serving), "kind": "dir", "saved_at": 2.0, "copy": str(state / "rollback" / "copies" / "9")},
    ])  # fmt: skip
    before = Snapshot(serving)
    answer = run("rollback", "restore", "--run-id", "deploy-1", "--state-dir", state)
    answer.expect(
        1, f"could not put back {serving}", "not restored", "copies/9", fix="rollback restore --run-id deploy-1"
    )
    before.unchanged()  # never absent, never half-copied
    assert unit.read_text() == "[Service]\nExecStart=/old\n"  # the first entry was put back whole
    outcome = _report(state / "runs" / "deploy-1" / "restore.json")
    assert outcome["restored"] == [str(unit)] and outcome["not_restored"] == [str(serving)]
    assert outcome["previous_stack_serves"] is False and outcome["exit_code"] == 1
    assert json.loads((state / "rollback" / "run.json").read_text())["closed"] is None  # still open: retry


def test_restore_of_a_run_that_ended_replaces_nothing_and_records_it_in_the_runs_directory(
    run: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    """The play's rescue after the gate's own rollback: nothing twice, exit 0; the outcome lands
    in the run's own directory, not at a fixed path."""
    state = host["state"]
    record = json.loads((state / "rollback" / "run.json").read_text())
    _record(state, "deploy-1", record["entries"], closed="restored")
    before = Snapshot(host["serving"], state / "rollback")
    run("rollback", "restore", "--run-id", "deploy-1", "--state-dir", state).expect(0, "replaced nothing")
    before.unchanged()
    outcome = _report(state / "runs" / "deploy-1" / "restore.json")
    assert outcome["exit_code"] == 0 and "ended already" in outcome["message"]


def test_restore_with_an_unwritable_json_path_changes_nothing(run: Run, tmp_path: Path, host: dict[str, Path]) -> None:
    record = json.loads((host["state"] / "rollback" / "run.json").read_text())
    _record(host["state"], "deploy-1", record["entries"], closed="restored")  # no restart, whatever the code
    before = Snapshot(tmp_path)
    target = tmp_path / "no-such-dir" / "outcome.json"
    run("rollback", "restore", "--run-id", "deploy-1", "--state-dir", host["state"], "--json", target).expect(
        2, "--json", str(target), "does not exist", fix="writable directory"
    )
    before.unchanged()


def test_restore_with_a_run_id_that_is_not_a_plain_name_is_refused(
    run: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    before = Snapshot(tmp_path)
    run("rollback", "restore", "--run-id", "../deploy-1", "--state-dir", host["state"]).expect(
        2, "--run-id", "not a plain name", fix="letters, digits"
    )
    before.unchanged()


# --------------------------------------------------------------------------- rollback recover


def test_recover_with_a_state_dir_that_does_not_exist_is_an_error(run: Run, tmp_path: Path) -> None:
    """Was "no interrupted run to recover" (exit 0) for a typo in the state directory."""
    missing = tmp_path / "no-such-state"
    run("rollback", "recover", "--run-id", "deploy-2", "--state-dir", missing).expect(
        2, "--state-dir", str(missing), "does not exist", fix="specdeploy facts"
    )
    assert not missing.exists()


RECOVER_RECORDS = [
    ("truncated", b'{"run_id": "deploy-1", "entr', ["not valid JSON"]),
    ("a-list", b"[]", ["expected a JSON object", "list"]),
    ("not-utf8", b'\xff{"run_id": "deploy-1"}', ["not UTF-8"]),
    ("unknown-kind", b'{"run_id": "deploy-1", "entries": [{"path": "/srv/x", "kind": "weird", "saved_at": 1, '
     b'"copy": "/nonexistent"}]}', ["entries[0].kind", "'weird'"]),
    ("saved-at-not-a-time", b'{"run_id": "deploy-1", "entries": [{"path": "/nonexistent/x", "kind": "file", '
     b'"saved_at": "yesterday", "copy": "/nonexistent"}]}', ["entries[0].saved_at", "'yesterday'"]),
]  # fmt: skip


@pytest.mark.parametrize(("content", "names"), [r[1:] for r in RECOVER_RECORDS], ids=[r[0] for r in RECOVER_RECORDS])
def test_recover_with_a_damaged_run_record_is_a_clear_error_that_touches_nothing(
    run: Run, tmp_path: Path, host: dict[str, Path], content: bytes, names: list[str]
) -> None:
    write(host["state"] / "rollback" / "run.json", content)
    before = Snapshot(tmp_path)
    run("rollback", "recover", "--run-id", "deploy-2", "--state-dir", host["state"]).expect(
        2, "rollback run record", *names, fix="move run.json aside"
    )
    before.unchanged()


def test_recover_with_a_run_id_that_is_not_a_plain_name_is_refused(
    run: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    record = json.loads((host["state"] / "rollback" / "run.json").read_text())
    _record(host["state"], "deploy-1", record["entries"], closed="verified")  # nothing to recover either way
    before = Snapshot(tmp_path)
    run("rollback", "recover", "--run-id", "x/../../y", "--state-dir", host["state"]).expect(
        2, "--run-id", fix="letters, digits"
    )
    before.unchanged()


def test_recover_whose_copy_back_fails_keeps_the_path_and_reports_in_the_interrupted_runs_directory(
    run: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    state, serving = host["state"], host["serving"]
    (state / "rollback" / "copies" / "0" / "config.json").unlink()
    (state / "rollback" / "copies" / "0").rmdir()
    before = Snapshot(serving)
    run("rollback", "recover", "--run-id", "deploy-2", "--state-dir", state).expect(
        1, f"could not put back {serving}", "not restored", fix="rollback restore --run-id deploy-1"
    )
    before.unchanged()
    outcome = _report(state / "runs" / "deploy-1" / "restore.json")
    assert outcome["not_restored"] == [str(serving)] and outcome["previous_stack_serves"] is False


def test_recover_with_nothing_interrupted_registers_the_run_for_a_later_restore(
    run: Run, tmp_path: Path, host: dict[str, Path]
) -> None:
    """Nothing to recover (exit 0); the new run is known from its first step on, so the rescue's
    `rollback restore` of a run that failed before replacing anything says "replaced nothing"."""
    state = host["state"]
    record = json.loads((state / "rollback" / "run.json").read_text())
    _record(state, "deploy-1", record["entries"], closed="verified")
    before = Snapshot(host["serving"], state / "rollback")
    run("rollback", "recover", "--run-id", "deploy-2", "--state-dir", state).expect(0, "no interrupted run")
    run("rollback", "restore", "--run-id", "deploy-2", "--state-dir", state).expect(0, "replaced nothing")
    before.unchanged()


def test_the_stub_answers_as_a_healthy_engine_so_each_case_isolates_one_bad_answer(
    run: Run, serve: Callable[..., str], tmp_path: Path
) -> None:
    """Not a bad input: the control every case above departs from by one answer."""
    report = tmp_path / "smoke.json"
    run("smoke", "--profile", "cpu-rehearsal", "--endpoint", serve(), "--json", report, *FAST).expect(
        0, "verdict: pass (exit 0)"
    )
    assert _report(report)["verdict"] == "pass"
