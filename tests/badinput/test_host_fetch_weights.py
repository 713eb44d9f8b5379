"""Bad input to `preflight`, `fetch`, `weights serve|access|prune` and `cdi status|record` (issue
20: D3, D4, D10, D17).

Each case runs the real CLI the way a user (or the preflight, weights and gpu_runtime roles)
does and checks what docs/commands.md's bad-input table promises: the exit code, the option, field or
file named, the fix, no traceback — and, where nothing may change, the models, serving and state
directories byte-identical to before. nvidia-smi and podman are never the real ones: `--nvidia-smi`
names a stand-in script in tmp_path (the recorded real hosts of tests/data/nvidia-smi, or one that
hangs, is not executable, prints garbage). The hub is never the real one either: a refused port,
a loopback socket that accepts and never answers, or a small http.server stub (127.0.0.1, an
ephemeral port, a daemon thread, shut down by its fixture) answering HTTP 500, an HTML page or the
hub's gated refusal. Short deadlines come by environment (SPECDEPLOY_FETCH_TIMEOUT/RETRIES,
SPECDEPLOY_PROGRAM_TIMEOUT) or by option; whatever could hang (a FIFO, a hanging nvidia-smi, a
silent server, a failing server retried for half a minute before the fix) runs as a subprocess
with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import huggingface_hub  # noqa: F401  imported now, with this process's environment: it reads HF_ENDPOINT once
import pytest
from tests.support import stub
from tests.support.badinput import (
    DRAFTER,
    REV_D,
    REV_T,
    ROOT,
    TARGET,
    Run,
    Snapshot,
    serve_argv,
    write,
)
from tests.support.stub import stubs

from specdeploy.profile import load_profile
from specdeploy.rehearsal import variants

DATA = ROOT / "tests" / "data" / "nvidia-smi"
FAST_FETCH = {"SPECDEPLOY_FETCH_TIMEOUT": "1", "SPECDEPLOY_FETCH_RETRIES": "0", "HF_TOKEN": "", "HF_ENDPOINT": ""}
FAST_PROGRAM = {"SPECDEPLOY_PROGRAM_TIMEOUT": "1"}
H200_DRIVER = "580.159.04"  # tests/data/nvidia-smi/h200-x2-r580


# --------------------------------------------------------------------------- stand-ins


def script(path: Path, body: str, mode: int = 0o755) -> Path:
    write(path, "#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def recorded_smi(tmp_path: Path, record: str, *, topo: str | None = None, q: str | None = None) -> Path:
    """The stand-in that replays a recorded real host (q.txt, topo.txt, csv.txt), optionally with
    another `topo -m` or `-q` output."""
    directory = tmp_path / f"smi-{record}"
    directory.mkdir(parents=True)
    for recorded in (DATA / record).glob("*.txt"):
        shutil.copy(recorded, directory / recorded.name)
    if topo is not None:
        write(directory / "topo.txt", topo)
    if q is not None:
        write(directory / "q.txt", q)
    shutil.copy(DATA / "stand-in.sh", directory / "nvidia-smi")
    (directory / "nvidia-smi").chmod(0o755)
    return directory / "nvidia-smi"


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def private(path: Path, content: str | bytes) -> Path:
    write(path, content).chmod(0o600)
    return path


def _pin(sha: str) -> dict[str, str]:
    return {"value": sha, "provenance": "rehearsal", "source": "a commit of the stub hub (bad-input suite)"}


@pytest.fixture
def pinned(tmp_path: Path) -> Path:
    """cpu-rehearsal with both revisions pinned, as a profile file: a fetch gets past its pins."""
    profile = variants.derive(
        load_profile("cpu-rehearsal"),
        "cpu-rehearsal-pinned",
        {"target": {"revision": _pin("a" * 40)}, "drafter": {"revision": _pin("b" * 40)}},
    )
    return variants.materialize(profile, tmp_path / "profiles")


@pytest.fixture
def no_drafter(tmp_path: Path) -> Path:
    """a6000-mtp (an MTP target: no separate drafter) with its target pinned."""
    profile = variants.derive(load_profile("a6000-mtp"), "a6000-mtp-pinned", {"target": {"revision": _pin("a" * 40)}})
    return variants.materialize(profile, tmp_path / "profiles")


@pytest.fixture
def refused() -> str:
    """An endpoint where nothing listens: a port bound and closed again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"https://127.0.0.1:{port}"


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


ANSWERS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "failing": (500, {"Content-Type": "text/plain"}, b"upstream connect error or disconnect/reset before headers"),
    "web page": (200, {"Content-Type": "text/html"}, b"<html><body><h1>Welcome to nginx!</h1></body></html>"),
    "gated": (
        401,
        {"Content-Type": "application/json", "X-Error-Code": "GatedRepo", "X-Error-Message": "Access restricted"},
        b'{"error": "Access to model is restricted. You must be authenticated to access it."}',
    ),
}


@pytest.fixture
def hub() -> Iterator[Callable[[str], str]]:
    """`hub("failing")`: the URL of a loopback stub answering every request as ANSWERS says."""
    with stubs() as started:

        def start(kind: str) -> str:
            status, headers, body = ANSWERS[kind]

            class Handler(BaseHTTPRequestHandler):
                def log_message(self, *args: Any) -> None:
                    pass

                def do_GET(self) -> None:  # noqa: N802
                    self.send_response(status)
                    for key, value in {**headers, "Content-Length": str(len(body))}.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(body)

                do_HEAD = do_GET  # noqa: N815

            return started.start(Handler, tls=True)

        yield start


# --------------------------------------------------------------------------- preflight (D4, D17)

GATED_FIX = "huggingface.co"


@pytest.fixture
def preflight(tmp_path: Path) -> Callable[..., tuple[object, ...]]:
    """The argv of `preflight` for a6000-dflash (TP 2) with a stand-in podman and models dir."""
    podman = script(tmp_path / "podman", "echo 'podman version 5.4.2'\n")

    def argv(smi: Path | str, *extra: object) -> tuple[object, ...]:
        return (
            "preflight",
            "-p",
            "a6000-dflash",
            "--nvidia-smi",
            smi,
            "--podman",
            podman,
            "--models-dir",
            tmp_path / "models",
            *extra,
        )

    return argv


def test_an_nvidia_smi_that_hangs_is_reported_after_the_timeout(
    run_process: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    smi = script(tmp_path / "nvidia-smi", "sleep 30\n")
    answer = run_process(*preflight(smi), env=FAST_PROGRAM)
    answer.expect(1, "nvidia-smi -q did not finish within 1 s", fix="dmesg")


def test_an_nvidia_smi_whose_child_keeps_the_output_open_is_stopped_at_the_deadline(
    run_process: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    """The shell exits, its `sleep` keeps stdout open: waiting for the end of output never ended."""
    smi = script(tmp_path / "nvidia-smi", "sleep 30 &\necho 'Driver Version : 535.54.03'\nexit 0\n")
    answer = run_process(*preflight(smi), env=FAST_PROGRAM)
    answer.expect(1, "did not finish within 1 s", fix="--timeout")


@pytest.mark.parametrize(
    ("make", "found"),
    [
        pytest.param(lambda p: script(p, "exit 0\n", mode=0o644), "permission denied", id="mode-644"),
        pytest.param(lambda p: (p.mkdir(), p)[1], "permission denied", id="a-directory"),
        pytest.param(
            lambda p: (write(p, "echo no interpreter line\n").chmod(0o755), p)[1], "Exec format error", id="no-shebang"
        ),  # fmt: skip
    ],
)
def test_an_nvidia_smi_that_cannot_be_run_is_a_failed_check_naming_it(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path, make: Callable[[Path], Path], found: str
) -> None:
    smi = make(tmp_path / "nvidia-smi")
    run(*preflight(smi)).expect(1, str(smi), "cannot be run", found, fix="--nvidia-smi")


@pytest.mark.parametrize(
    ("output", "names"),
    [
        pytest.param("Driver Version : 535.54.03\nAttached GPUs : two\n", ("Attached GPUs", "'two'"), id="count-word"),
        pytest.param("Driver Version : 535.54.03\nAttached GPUs : 2.5\n", ("Attached GPUs", "'2.5'"), id="count-float"),
        pytest.param("", ("printed nothing",), id="nothing"),
        pytest.param("Driver Version : N/A\nAttached GPUs : 2\n", ("Driver Version", "'N/A'"), id="driver-na"),
    ],
)
def test_an_nvidia_smi_printing_no_number_where_one_belongs_is_a_failed_check(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path, output: str, names: tuple[str, ...]
) -> None:
    q = write(tmp_path / "q.txt", output)
    smi = script(tmp_path / "nvidia-smi", f'[ "$1" = "-q" ] && cat "{q}"\nexit 0\n')
    run(*preflight(smi)).expect(1, "gpus", *names, fix="nvidia-smi")


def test_an_nvidia_smi_printing_bytes_that_are_not_utf8_is_a_failed_check(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    smi = script(tmp_path / "nvidia-smi", "printf 'Driver Version : \\377\\376\\n'\n")
    run(*preflight(smi)).expect(1, "printed no driver version", fix="nvidia-smi")


def test_an_nvidia_smi_printing_without_end_is_stopped(
    run_process: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    smi = script(tmp_path / "nvidia-smi", "exec yes 'Attached GPUs : 2'\n")
    run_process(*preflight(smi), env=FAST_PROGRAM).expect(1, "printed more than 16 MiB", fix="--nvidia-smi")


def test_the_nvlink_check_on_one_gpu_says_there_is_nothing_to_check_not_ok(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    """D17: a TP=2 profile on a host with one GPU said "nvlink ok, NVLink: ?"."""
    one_gpu_topo = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-63\t0\n"
    smi = recorded_smi(tmp_path, "a6000-x1-r515", topo=one_gpu_topo)
    answer = run(*preflight(smi)).expect(
        1,
        "no group of 2 GPUs to check",
        fix="deploy to a host with 2 GPUs, or use a profile with tensor_parallel_size 1",
    )
    nvlink = next(line for line in answer.stdout.splitlines() if line.startswith("│ nvlink "))
    assert [cell.strip() for cell in nvlink.split("│")][2] == "skip", nvlink
    assert "no group of 2 GPUs" in nvlink and "fail nvlink" not in answer.text
    assert "NVLink: ?" not in answer.text


def test_a_topology_that_does_not_show_a_tensor_parallel_pair_is_not_called_nvlink(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    """Four GPUs attached, but `topo -m` lists only GPU0: unknown, a warning with its fix."""
    smi = recorded_smi(tmp_path, "a6000-x4-r515", topo="\tGPU0\tCPU Affinity\nGPU0\t X \t0-63\n")
    answer = run(*preflight(smi)).expect(1, "nvlink", "shows no link between GPU0-GPU1", fix="nvidia-smi topo -m")
    assert "NVLink: ?" not in answer.text


def test_an_unknown_weights_source_is_a_usage_error(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    smi = recorded_smi(tmp_path, "a6000-x4-r515")
    run(*preflight(smi, "--weights-source", "s3")).expect(2, "--weights-source", "'s3'", "hub, archive", fix="hub")


@pytest.mark.parametrize(
    ("content", "names"),
    [
        pytest.param("", ("is empty",), id="empty"),
        pytest.param("\n  \n", ("is empty",), id="blank-lines"),
        pytest.param(b"hf_\xff\xfe\n", ("not UTF-8",), id="not-utf8"),
        pytest.param("hf_one hf_two\n", ("more than one word",), id="two-words"),
    ],
)
def test_a_token_file_that_holds_no_token_is_refused_before_any_check(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path, content: str | bytes, names: tuple[str, ...]
) -> None:
    token = private(tmp_path / "token", content)
    smi = recorded_smi(tmp_path, "a6000-x4-r515")
    answer = run(*preflight(smi, "--token-file", token), env={"HF_TOKEN": ""})
    answer.expect(2, "token file", str(token), *names, fix="token")
    assert "hf_one" not in answer.text and "hf_two" not in answer.text  # a token is never shown


def test_a_token_file_that_is_a_fifo_is_refused_at_once(
    run_process: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path
) -> None:
    token = fifo(tmp_path / "token")
    token.chmod(0o600)
    smi = recorded_smi(tmp_path, "a6000-x4-r515")
    answer = run_process(*preflight(smi, "--token-file", token))
    answer.expect(2, "token file", "FIFO", fix="--token-file")


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_a_program_timeout_that_is_not_a_positive_number_of_seconds_is_refused(
    run: Run, preflight: Callable[..., tuple[object, ...]], tmp_path: Path, value: str
) -> None:
    smi = recorded_smi(tmp_path, "a6000-x4-r515")
    run(*preflight(smi), env={"SPECDEPLOY_PROGRAM_TIMEOUT": value}).expect(
        2, "--timeout", "more than 0", fix="--timeout 60"
    )


# --------------------------------------------------------------------------- fetch (D3, D10, D17)


def fetch_argv(dest: Path, profile: Path, endpoint: str, tmp_path: Path, *extra: object) -> tuple[object, ...]:
    return (
        "fetch", dest, "-p", profile, "--lock", tmp_path / "specdeploy.lock", "--endpoint", endpoint,
        "--ca-file", stub.ca(), *extra,
    )  # fmt: skip


@pytest.mark.parametrize("only", ["weights", "both", "Target", ""])
def test_fetch_only_with_a_value_that_is_not_a_role_is_a_usage_error(
    run: Run, pinned: Path, refused: str, tmp_path: Path, snapshot: Callable[..., Snapshot], only: str
) -> None:
    """D10: `--only weights` fetched nothing and exited 0."""
    before = snapshot(tmp_path)
    answer = run(*fetch_argv(tmp_path / "models", pinned, refused, tmp_path, "--only", only), env=FAST_FETCH)
    answer.expect(2, "--only", "target, drafter", "nothing was fetched", fix="--only target")
    before.unchanged()


def test_fetch_only_drafter_of_a_profile_without_a_drafter_is_a_usage_error(
    run: Run, no_drafter: Path, refused: str, tmp_path: Path, snapshot: Callable[..., Snapshot]
) -> None:
    before = snapshot(tmp_path)
    answer = run(*fetch_argv(tmp_path / "models", no_drafter, refused, tmp_path, "--only", "drafter"), env=FAST_FETCH)
    answer.expect(2, "--only drafter", "has no drafter", fix="leave --only out")
    before.unchanged()


def test_an_unreachable_endpoint_fails_in_seconds_naming_it(
    run_process: Run, pinned: Path, refused: str, tmp_path: Path, snapshot: Callable[..., Snapshot]
) -> None:
    """D3: a refused connection was retried for 24 s and then ended in a traceback."""
    before = snapshot(tmp_path)
    answer = run_process(*fetch_argv(tmp_path / "models", pinned, refused, tmp_path), env=FAST_FETCH)
    answer.expect(1, refused, "unreachable", "connection refused", "nothing was downloaded", fix="check the endpoint")
    before.unchanged()  # not even the destination directory is left behind


def test_an_endpoint_that_never_answers_fails_after_the_timeout(
    run_process: Run, pinned: Path, silent: str, tmp_path: Path
) -> None:
    """D3: huggingface_hub's client has no timeout: a silent server held the fetch forever."""
    answer = run_process(*fetch_argv(tmp_path / "models", pinned, silent, tmp_path), env=FAST_FETCH)
    answer.expect(1, silent, "did not answer", "no answer within 1 s", fix="--timeout")


def test_an_endpoint_answering_http_500_fails_naming_the_status_and_the_body(
    run_process: Run, pinned: Path, hub: Callable[[str], str], tmp_path: Path
) -> None:
    url = hub("failing")
    answer = run_process(*fetch_argv(tmp_path / "models", pinned, url, tmp_path), env=FAST_FETCH)
    answer.expect(1, url, "HTTP 500", "upstream connect error", fix="check its logs")


def test_an_endpoint_that_is_a_web_page_is_not_the_hub_api(
    run: Run, pinned: Path, hub: Callable[[str], str], tmp_path: Path
) -> None:
    url = hub("web page")
    answer = run(*fetch_argv(tmp_path / "models", pinned, url, tmp_path), env=FAST_FETCH)
    answer.expect(1, url, "not the hub API", "text/html", "Welcome to nginx", fix="base URL")


def test_a_gated_refusal_without_a_token_says_no_token_was_given(
    run: Run, pinned: Path, hub: Callable[[str], str], tmp_path: Path
) -> None:
    """D17: the refusal said "this token may not download it" when no token was given."""
    answer = run(*fetch_argv(tmp_path / "models", pinned, hub("gated"), tmp_path), env=FAST_FETCH)
    answer.expect(1, TARGET, "is gated", "no token was given", fix="--token-file")
    assert "this token" not in answer.text


@pytest.mark.parametrize(
    ("endpoint", "env", "named"),
    [
        pytest.param("127.0.0.1:8090", {}, "--endpoint", id="no-scheme"),
        pytest.param("ftp://mirror.example/hf", {}, "--endpoint", id="ftp"),
        pytest.param(None, {"HF_ENDPOINT": "hub.internal:8090"}, "$HF_ENDPOINT", id="env-no-scheme"),
    ],
)
def test_an_endpoint_that_is_not_an_http_url_is_a_usage_error(
    run: Run,
    pinned: Path,
    tmp_path: Path,
    snapshot: Callable[..., Snapshot],
    endpoint: str | None,
    env: dict[str, str],
    named: str,
) -> None:
    before = snapshot(tmp_path)
    argv = ("fetch", tmp_path / "models", "-p", pinned, "--lock", tmp_path / "specdeploy.lock")
    answer = run(*argv, *(("--endpoint", endpoint) if endpoint else ()), env={**FAST_FETCH, **env})
    answer.expect(2, named, "expected the base URL", fix="http")
    before.unchanged()


def _read_only_destination(tmp_path: Path) -> Path:
    """A destination this process cannot create: under sysfs for root (which permissions do not
    stop), under a directory of mode 555 for anyone else."""
    if os.geteuid() == 0:
        return Path("/sys/specdeploy-badinput/models")
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o555)
    return parent / "models"


def test_a_destination_that_cannot_be_written_is_refused_before_any_download(
    run_process: Run, pinned: Path, refused: str, tmp_path: Path
) -> None:
    """D3: a read-only destination ended in a traceback (after the network was tried)."""
    dest = _read_only_destination(tmp_path)
    answer = run_process(*fetch_argv(dest, pinned, refused, tmp_path), env=FAST_FETCH)
    answer.expect(1, f"destination {dest} is not writable", "nothing was fetched", fix="writable filesystem")
    assert not dest.exists()


@pytest.mark.parametrize("under", [False, True], ids=["is-a-file", "under-a-file"])
def test_a_destination_that_is_a_file_is_a_usage_error_and_the_file_is_untouched(
    run_process: Run, pinned: Path, refused: str, tmp_path: Path, snapshot: Callable[..., Snapshot], under: bool
) -> None:
    models = write(tmp_path / "models", "not a directory\n")
    before = snapshot(tmp_path)
    dest = models / "sub" if under else models
    answer = run_process(*fetch_argv(dest, pinned, refused, tmp_path), env=FAST_FETCH)
    answer.expect(2, f"destination {dest}", "expected a directory", fix="pass DEST the directory")
    before.unchanged()


@pytest.mark.parametrize(
    ("make", "names"),
    [
        pytest.param(lambda p: p, ("does not exist",), id="missing"),
        pytest.param(lambda p: (p.mkdir(), p)[1], ("found a directory",), id="a-directory"),
        pytest.param(lambda p: private(p, ""), ("is empty",), id="empty"),
        pytest.param(lambda p: private(p, b"\x00\xff" * 8), ("not UTF-8",), id="binary"),
    ],
)
def test_a_token_file_that_is_missing_or_holds_no_token_is_refused_before_the_network(
    run_process: Run,
    pinned: Path,
    refused: str,
    tmp_path: Path,
    snapshot: Callable[..., Snapshot],
    make: Callable[[Path], Path],
    names: tuple[str, ...],
) -> None:
    """D3: a missing token file was a traceback; an empty one fetched without a token."""
    token = make(tmp_path / "hf-token")
    before = snapshot(tmp_path)
    argv = fetch_argv(tmp_path / "models", pinned, refused, tmp_path, "--token-file", token)
    run_process(*argv, env=FAST_FETCH).expect(2, f"token file {token}", *names, fix="token")
    before.unchanged()


def test_a_token_file_that_is_a_fifo_is_refused_without_blocking(
    run_process: Run, pinned: Path, refused: str, tmp_path: Path
) -> None:
    token = fifo(tmp_path / "hf-token")
    token.chmod(0o600)
    argv = fetch_argv(tmp_path / "models", pinned, refused, tmp_path, "--token-file", token)
    run_process(*argv, env=FAST_FETCH).expect(2, "token file", "FIFO", fix="--token-file")


def test_a_token_on_stdin_that_is_two_words_is_refused_without_showing_it(
    run: Run, pinned: Path, refused: str, tmp_path: Path
) -> None:
    argv = fetch_argv(tmp_path / "models", pinned, refused, tmp_path, "--token-stdin")
    answer = run(*argv, input="hf_secretA hf_secretB\n", env=FAST_FETCH)
    answer.expect(2, "standard input", "more than one word", fix="one line")
    assert "hf_secret" not in answer.text


@pytest.mark.parametrize(("option", "value"), [("--timeout", "0"), ("--timeout", "-1"), ("--retries", "-1")])
def test_fetch_deadlines_out_of_range_are_usage_errors(
    run: Run, pinned: Path, refused: str, tmp_path: Path, option: str, value: str
) -> None:
    answer = run(*fetch_argv(tmp_path / "models", pinned, refused, tmp_path, f"{option}={value}"), env=FAST_FETCH)
    answer.expect(2, option, fix=f"pass e.g. {option}")


# --------------------------------------------------------------------------- weights serve


MANIFEST_FIX = "copy the weights archive again"


@pytest.mark.parametrize(
    ("manifest", "names"),
    [
        pytest.param(b"[]", ("expected a JSON object", "list"), id="a-list"),
        pytest.param(b'{"models": []}', ("field models", "list"), id="models-a-list"),
        pytest.param(b'{"models": {"%s": "x"}}' % TARGET.encode(), (f"models.{TARGET}",), id="entry-a-string"),
        pytest.param(
            b'{"models": {"%s": {"revision": 5}}}' % TARGET.encode(),
            (f"models.{TARGET}.revision", "'5'"),
            id="revision-a-number",
        ),  # fmt: skip
        pytest.param(
            b'{"models": {"%s": {"revision": "../../.."}}}' % TARGET.encode(),
            (f"models.{TARGET}.revision", "'../../..'"),
            id="revision-a-path",
        ),  # fmt: skip
        pytest.param(
            b'{"models": {"%s": {"revision": "%s", "files": ["config.json"]}}}' % (TARGET.encode(), REV_T.encode()),
            (f"models.{TARGET}.files",),
            id="files-a-list",
        ),  # fmt: skip
        pytest.param(b'{"models": \xff}', ("not UTF-8",), id="not-utf8"),
        pytest.param(b'{"models": {', ("not valid JSON",), id="truncated"),
    ],
)
def test_an_archive_manifest_of_another_shape_is_refused_and_nothing_is_served(
    run: Run, archive: dict[str, Path], snapshot: Callable[..., Snapshot], manifest: bytes, names: tuple[str, ...]
) -> None:
    write(archive["models"] / "specdeploy-archive.json", manifest)
    before = snapshot(archive["root"])
    run(*serve_argv(archive)).expect(2, "specdeploy-archive.json", *names, fix=MANIFEST_FIX)
    before.unchanged()


def test_a_serving_dir_that_is_a_file_is_a_usage_error_not_free_space_or_remount(
    run: Run, archive: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    """D17: a serving path that is a file got the hint "free space or remount read-write"."""
    archive["serving"].rmdir()
    write(archive["serving"], "a file where the serving directory goes\n")
    before = snapshot(archive["root"])
    answer = run(*serve_argv(archive)).expect(2, f"{archive['serving']} is a file", fix="move that file away")
    assert "free space" not in answer.text
    before.unchanged()


def test_a_revision_that_is_a_file_is_named_as_a_file_not_as_missing(
    run: Run, archive: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    drafter = archive["models"] / DRAFTER / REV_D
    shutil.rmtree(drafter)
    write(drafter, "a file where the drafter's revision directory goes\n")
    before = snapshot(archive["root"])
    run(*serve_argv(archive)).expect(1, str(drafter), "is a file, not a revision directory", fix="move")
    before.unchanged()  # the target was not hashed or recorded either


def test_a_lock_revision_that_is_a_path_is_refused_before_anything_is_hashed(
    run: Run, archive: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    """A lock entry `target.revision: "../.."` made the models directory itself the revision."""
    entry = {"value": "../..", "recorded_by": "hand", "recorded_at": "2026-01-01T00:00:00+00:00"}
    write(archive["lock"], json.dumps({"schema_version": 1, "profiles": {"cpu-rehearsal": {"target.revision": entry}}}))
    before = snapshot(archive["root"])
    run(*serve_argv(archive)).expect(2, "target.revision", "'../..'", fix="restore the lock")
    before.unchanged()


@pytest.mark.parametrize(
    "cache", [b"[]", b'{"config.json": {"sha256": "0"}}', b"\xff\xfe"], ids=["a-list", "no-size", "not-utf8"]
)
def test_a_damaged_hash_cache_is_rebuilt_not_a_traceback(run: Run, archive: dict[str, Path], cache: bytes) -> None:
    write(archive["models"] / TARGET / REV_T / ".specdeploy" / "verified.json", cache)
    answer = run(*serve_argv(archive)).expect(0, "links_changed")
    assert json.loads(answer.stdout)["models"][0]["files"] == 1
    assert (archive["serving"] / "target").is_symlink()


# --------------------------------------------------------------------------- weights access


@pytest.fixture
def trees(tmp_path: Path) -> dict[str, Path]:
    models, serving = tmp_path / "models", tmp_path / "serving"
    write(models / TARGET / REV_T / "model.safetensors", b"\0" * 64).chmod(0o644)
    serving.mkdir()
    (serving / "target").symlink_to(os.path.relpath(models / TARGET / REV_T, serving))
    return {"models": models, "serving": serving, "root": tmp_path}


@pytest.mark.parametrize("gid", ["-1", "-5", str(2**32), str(2**40)])
def test_a_gid_out_of_range_is_refused_and_nothing_is_chowned(
    run: Run, trees: dict[str, Path], snapshot: Callable[..., Snapshot], gid: str
) -> None:
    """--gid -1 left the group as it was (never converged); 2**32 was a traceback after changes."""
    before = snapshot(trees["root"])
    argv = ("weights", "access", f"--gid={gid}", "--models-dir", trees["models"], "--serving-dir", trees["serving"])
    run(*argv).expect(2, f"--gid {gid}", "nothing was changed", fix="the engine's gid")
    before.unchanged()


@pytest.mark.parametrize("which", ["models", "serving"])
def test_a_models_or_serving_dir_that_is_a_regular_file_keeps_its_mode(
    run: Run, trees: dict[str, Path], snapshot: Callable[..., Snapshot], which: str
) -> None:
    """A `--models-dir` naming a file had its mode changed to 750."""
    stray = write(trees["root"] / "notes.txt", "a file given as a directory\n")
    stray.chmod(0o644)
    dirs = {"models": trees["models"], "serving": trees["serving"], which: stray}
    before = snapshot(trees["root"])
    argv = ("weights", "access", "--gid", "10001", "--models-dir", dirs["models"], "--serving-dir", dirs["serving"])
    run(*argv).expect(2, str(stray), "found a regular file", "nothing was changed", fix="--models-dir")
    before.unchanged()


def test_a_serving_dir_that_is_a_fifo_is_refused(
    run: Run, trees: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    pipe = fifo(trees["root"] / "serving-pipe")
    before = snapshot(trees["root"])
    argv = ("weights", "access", "--gid", "10001", "--models-dir", trees["models"], "--serving-dir", pipe)
    run(*argv).expect(2, str(pipe), "not a directory", fix="--serving-dir")
    assert stat.S_ISFIFO(pipe.lstat().st_mode)
    before.unchanged()


# --------------------------------------------------------------------------- weights prune


@pytest.fixture
def served_before(tmp_path: Path) -> dict[str, Path]:
    """One verified revision that the last passing gate run served (prune must keep it)."""
    models, serving, state = tmp_path / "models", tmp_path / "serving", tmp_path / "state"
    revision = models / TARGET / REV_T
    write(revision / "model.safetensors", b"\1" * 64)
    write(revision / ".specdeploy" / "verified.json", "{}")
    serving.mkdir()
    report = {"verdict": "pass", "served": [str(revision)], "finished_at": "2026-01-01T00:00:00+00:00"}
    write(state / "runs" / "run-1" / "gate.json", json.dumps(report))
    return {"models": models, "serving": serving, "state": state, "revision": revision, "root": tmp_path}


def prune_argv(host: dict[str, Path]) -> tuple[object, ...]:
    return (
        "weights",
        "prune",
        "-p",
        "cpu-rehearsal",
        "--models-dir",
        host["models"],
        "--serving-dir",
        host["serving"],
        "--state-dir",
        host["state"],
    )


PRUNE_FIX = "repair or remove"


@pytest.mark.parametrize(
    ("report", "names"),
    [
        pytest.param(b"[]", ("expected a JSON object",), id="a-list"),
        pytest.param(b'{"verdict": "pass", "served": [', ("not valid JSON",), id="truncated"),
        pytest.param(b'{"verdict": "pass", "served": \xff}', ("not UTF-8",), id="not-utf8"),
        pytest.param(b'{"verdict": "pass", "served": "/var/lib/x"}', ("field served",), id="served-a-string"),
        pytest.param(b'{"verdict": "pass", "served": [1, 2]}', ("field served",), id="served-numbers"),
    ],
)
def test_a_gate_report_of_another_shape_stops_the_prune_and_nothing_is_deleted(
    run: Run, served_before: dict[str, Path], snapshot: Callable[..., Snapshot], report: bytes, names: tuple[str, ...]
) -> None:
    """A truncated report or `served` of another shape made prune delete the revision that run served."""
    gate = write(served_before["state"] / "runs" / "run-2" / "gate.json", report)
    before = snapshot(served_before["root"])
    run(*prune_argv(served_before)).expect(2, str(gate), *names, fix=PRUNE_FIX)
    before.unchanged()


def test_a_finished_at_that_is_a_number_stops_the_prune(
    run: Run, served_before: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    report = {"verdict": "pass", "served": [str(served_before["revision"])], "finished_at": 5}
    gate = write(served_before["state"] / "runs" / "run-2" / "gate.json", json.dumps(report))
    before = snapshot(served_before["root"])
    run(*prune_argv(served_before)).expect(2, str(gate), "field finished_at", fix=PRUNE_FIX)
    before.unchanged()


def test_a_gate_report_that_is_a_directory_stops_the_prune(
    run: Run, served_before: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    gate = served_before["state"] / "runs" / "run-2" / "gate.json"
    gate.mkdir(parents=True)
    before = snapshot(served_before["root"])
    run(*prune_argv(served_before)).expect(2, str(gate), "found a directory", fix=PRUNE_FIX)
    before.unchanged()


def test_a_gate_report_that_is_a_fifo_is_refused_without_blocking(
    run_process: Run, served_before: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    gate = fifo(served_before["state"] / "runs" / "run-2" / "gate.json")
    before = snapshot(served_before["root"])
    run_process(*prune_argv(served_before)).expect(2, str(gate), "FIFO", fix=PRUNE_FIX)
    before.unchanged()


# --------------------------------------------------------------------------- cdi status|record (D4, D17)


@pytest.fixture
def cdi_host(tmp_path: Path) -> dict[str, Path]:
    spec = write(tmp_path / "etc" / "cdi" / "nvidia.yaml", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    return {"spec": spec, "state": tmp_path / "state", "smi": recorded_smi(tmp_path, "h200-x2-r580"), "root": tmp_path}


def cdi_argv(verb: str, host: dict[str, Path], **override: Path) -> tuple[object, ...]:
    paths = {**host, **override}
    return ("cdi", verb, "--spec", paths["spec"], "--state-dir", paths["state"], "--nvidia-smi", paths["smi"])


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_cdi_status_of_a_spec_that_is_not_a_file_is_refused_not_called_missing(
    run: Run, cdi_host: dict[str, Path], snapshot: Callable[..., Snapshot], kind: str
) -> None:
    """D17: a spec path that was a directory was reported as "does not exist; regenerate"."""
    spec = cdi_host["root"] / "etc" / "cdi" / "nvidia-spec"
    spec.mkdir() if kind == "directory" else fifo(spec)
    before = snapshot(cdi_host["root"])
    answer = run(*cdi_argv("status", cdi_host, spec=spec))
    answer.expect(2, str(spec), "directory" if kind == "directory" else "FIFO", fix="move")
    assert "does not exist" not in answer.text
    before.unchanged()


def test_cdi_status_with_a_stamp_that_is_a_fifo_is_refused_without_blocking(
    run_process: Run, cdi_host: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    stamp = fifo(cdi_host["state"] / "cdi.json")
    before = snapshot(cdi_host["root"])
    run_process(*cdi_argv("status", cdi_host)).expect(2, str(stamp), "FIFO", fix=f"remove {stamp}")
    before.unchanged()


def test_cdi_status_with_an_nvidia_smi_that_hangs_is_an_error_after_the_timeout(
    run_process: Run, cdi_host: dict[str, Path], tmp_path: Path
) -> None:
    smi = script(tmp_path / "hanging-smi", "sleep 30\n")
    answer = run_process(*cdi_argv("status", cdi_host, smi=smi), env=FAST_PROGRAM)
    answer.expect(1, "cannot read the driver version", "did not finish within 1 s", fix="dmesg")


def test_cdi_record_with_an_nvidia_smi_that_is_not_executable_writes_no_stamp(
    run: Run, cdi_host: dict[str, Path], tmp_path: Path, snapshot: Callable[..., Snapshot]
) -> None:
    smi = script(tmp_path / "smi-644", "exit 0\n", mode=0o644)
    before = snapshot(cdi_host["root"])
    run(*cdi_argv("record", cdi_host, smi=smi)).expect(1, str(smi), "cannot be run", fix="--nvidia-smi")
    before.unchanged()


def test_cdi_record_into_a_stamp_that_is_a_directory_is_refused_before_nvidia_smi(
    run: Run, cdi_host: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    """It failed the write with "free space or remount"."""
    stamp = cdi_host["state"] / "cdi.json"
    stamp.mkdir(parents=True)
    before = snapshot(cdi_host["root"])
    answer = run(*cdi_argv("record", cdi_host)).expect(2, str(stamp), "found a directory", fix=f"remove {stamp}")
    assert "free space" not in answer.text
    before.unchanged()


def test_cdi_record_with_a_state_dir_that_is_a_file_is_refused(
    run: Run, cdi_host: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    write(cdi_host["state"], "not a directory\n")
    before = snapshot(cdi_host["root"])
    answer = run(*cdi_argv("record", cdi_host)).expect(2, "state directory", "is a file", fix="--state-dir")
    assert "free space" not in answer.text
    before.unchanged()


def test_cdi_record_of_a_spec_that_is_a_directory_records_nothing(
    run: Run, cdi_host: dict[str, Path], snapshot: Callable[..., Snapshot]
) -> None:
    spec = cdi_host["root"] / "spec-dir"
    spec.mkdir()
    before = snapshot(cdi_host["root"])
    run(*cdi_argv("record", cdi_host, spec=spec)).expect(2, str(spec), "a directory", fix="nvidia-ctk cdi generate")
    before.unchanged()


def test_cdi_status_with_a_program_timeout_of_zero_is_a_usage_error(run: Run, cdi_host: dict[str, Path]) -> None:
    run(*cdi_argv("status", cdi_host), "--timeout", "0").expect(2, "--timeout 0", fix="--timeout 60")


def untouchable_smi(tmp_path: Path) -> Path:
    """An nvidia-smi stand-in that leaves a mark when run: a refusal must come before it."""
    return script(tmp_path / "tripwire-smi", f"touch {tmp_path / 'smi-ran'}\nexit 1\n")


def test_cdi_record_of_a_spec_that_does_not_exist_records_nothing_and_runs_no_nvidia_smi(
    run: Run, cdi_host: dict[str, Path], tmp_path: Path, snapshot: Callable[..., Snapshot]
) -> None:
    """`record` right after a `nvidia-ctk cdi generate` that failed (or wrote elsewhere)."""
    spec = cdi_host["root"] / "etc" / "cdi" / "nvidia-gpu.yaml"
    smi = untouchable_smi(tmp_path)
    before = snapshot(cdi_host["root"])
    run(*cdi_argv("record", cdi_host, spec=spec, smi=smi)).expect(
        2, str(spec), "does not exist", "nothing to record", fix=f"nvidia-ctk cdi generate --output {spec}"
    )
    before.unchanged()
    assert not (tmp_path / "smi-ran").exists() and not (cdi_host["state"] / "cdi.json").exists()


def test_cdi_record_of_a_spec_that_is_a_fifo_is_refused_without_hashing_it(
    run_process: Run, cdi_host: dict[str, Path], tmp_path: Path
) -> None:
    """Hashing a FIFO blocks until something writes to it: it must be refused by its type."""
    spec = fifo(cdi_host["root"] / "etc" / "cdi" / "nvidia-fifo.yaml")
    answer = run_process(*cdi_argv("record", cdi_host, spec=spec, smi=untouchable_smi(tmp_path)))
    answer.expect(2, str(spec), "a FIFO (named pipe)", fix="nvidia-ctk cdi generate")
    assert not (tmp_path / "smi-ran").exists() and not (cdi_host["state"] / "cdi.json").exists()


@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "3601"])
def test_cdi_record_with_a_program_timeout_out_of_range_is_a_usage_error_that_records_nothing(
    run: Run, cdi_host: dict[str, Path], tmp_path: Path, timeout: str
) -> None:
    smi = untouchable_smi(tmp_path)
    run(*cdi_argv("record", cdi_host, smi=smi), "--timeout", timeout).expect(
        2, f"--timeout {float(timeout):g}", "at most 3600", fix="--timeout 60"
    )
    assert not (tmp_path / "smi-ran").exists() and not cdi_host["state"].exists()


def test_cdi_record_when_the_gpus_report_different_drivers_records_nothing(
    run: Run, cdi_host: dict[str, Path], tmp_path: Path, snapshot: Callable[..., Snapshot]
) -> None:
    """Half-way through a driver upgrade: no one spec fits both GPUs, so no stamp may say it does."""
    csv = write(
        tmp_path / "mixed.csv",
        "name, compute_cap, driver_version, pci.bus_id, memory.total [MiB]\n"
        "NVIDIA H200, 9.0, 580.159.04, 00000000:00:06.0, 143771 MiB\n"
        "NVIDIA H200, 9.0, 570.86.15, 00000000:00:07.0, 143771 MiB\n",
    )
    smi = script(tmp_path / "mixed-smi", f'cat "{csv}"\n')
    before = snapshot(cdi_host["root"])
    run(*cdi_argv("record", cdi_host, smi=smi)).expect(
        1,
        "different driver versions",
        "580.159.04",
        "570.86.15",
        fix="reboot the host so every GPU runs the same driver",
    )
    before.unchanged()
    assert not (cdi_host["state"] / "cdi.json").exists()


def test_cdi_record_with_an_nvidia_smi_that_hangs_records_nothing_after_the_timeout(
    run_process: Run, cdi_host: dict[str, Path], tmp_path: Path
) -> None:
    smi = script(tmp_path / "hanging-smi", "sleep 30\n")
    answer = run_process(*cdi_argv("record", cdi_host, smi=smi), "--timeout", "1")
    answer.expect(1, "cannot read the driver version", "did not finish within 1 s", fix="dmesg")
    assert not (cdi_host["state"] / "cdi.json").exists()
