"""Property tests for the parsers of host and weights input (issue 20): whatever nvidia-smi prints,
whatever bytes sit in a CDI stamp, a token file, an archive manifest, a hash cache or a gate
report, and whatever string is given as an endpoint, the answer is a value or one of the
project's own errors (a SpecdeployError subclass, which the CLI turns into a message and an exit
code) — never another exception, which the CLI would report as a bug (exit 70).

Bounded and repeatable: derandomized, at most 200 examples each, each within a deadline of
seconds (ample on a shared machine; an unbounded parse fails); files are written into one
temporary directory per test.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeploy.core import hashcache, layout
from specdeploy.core.errors import SpecdeployError
from specdeploy.host import cdi, gpus, preflight
from specdeploy.weights import fetch, store

# Per example: typical runs take milliseconds (--hypothesis-show-statistics); an input that makes a parser
# unbounded (D14: minutes) fails at once, while a loaded 2-core CI machine has room to spare.
DEADLINE = timedelta(seconds=2)

SETTINGS = settings(
    max_examples=200, deadline=DEADLINE, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SMALL = settings(
    max_examples=60, deadline=DEADLINE, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# text that looks like nvidia-smi's: its field names and values, or noise
KEYS = st.sampled_from(
    ["Driver Version", "KMD Version", "CUDA Version", "CUDA UMD Version", "Attached GPUs", "Product Name", "Timestamp"]
)
VALUES = st.one_of(
    st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,3}){0,2}", fullmatch=True),
    st.sampled_from(["N/A", "Not Found", "two", "", "-1", "1e9", "٣", "０", "2.5", "535."]),
    st.text(max_size=20),
)
LINES = st.one_of(
    st.builds(lambda indent, key, value: f"{indent}{key} : {value}", st.sampled_from(["", "    ", "\t"]), KEYS, VALUES),
    st.from_regex(r"GPU [0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]", fullmatch=True),
    st.text(max_size=40),
)
SMI_TEXT = st.one_of(st.text(max_size=400), st.lists(LINES, max_size=20).map("\n".join))
TOPO_LINES = st.one_of(
    st.lists(st.sampled_from(["GPU0", "GPU1", "GPU2", "GPU٣", "NIC0", "CPU Affinity"]), max_size=6).map(
        lambda cols: "\t" + "\t".join(cols)
    ),
    st.builds(
        lambda i, cells: f"GPU{i}\t" + "\t".join(cells),
        st.one_of(st.integers(0, 9).map(str), st.just("٣")),
        st.lists(st.sampled_from([" X ", "NV4", "NV18", "PHB", "SYS", "PIX", "", "0-63"]), max_size=6),
    ),
    st.text(max_size=40),
)
TOPO_TEXT = st.one_of(st.text(max_size=300), st.lists(TOPO_LINES, max_size=10).map("\n".join))
CSV_TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(
        st.lists(
            st.one_of(st.sampled_from(["9.0", "580.1", "00000000:00:06.0", "", "x.y", "8.6"]), st.text(max_size=8)),
            max_size=6,
        ).map(", ".join),  # fmt: skip
        max_size=6,
    ).map(lambda rows: "\n".join(["name, compute_cap, driver_version, pci.bus_id, memory.total [MiB]", *rows])),
)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="specdeploy-prop-") as directory:
        yield Path(directory)


def only_own_errors(call: Any, *args: Any, **kwargs: Any) -> Any:
    """`call(...)`'s value, or None when it raised one of the project's own errors."""
    try:
        return call(*args, **kwargs)
    except SpecdeployError as exc:
        assert exc.message, "an error must say what is wrong"
        return None


# --------------------------------------------------------------------------- nvidia-smi


@SETTINGS
@given(SMI_TEXT)
def test_nvidia_smi_q_output_parses_or_is_a_gpu_query_error(text: str) -> None:
    try:
        inventory = gpus.parse_query(text)
    except gpus.GpuQueryError:
        return
    assert inventory.attached >= 0 and inventory.driver_branch >= 0
    for gpu in inventory.gpus:
        assert gpu.compute_capability is None or gpu.compute_capability > 0


@SETTINGS
@given(TOPO_TEXT, st.integers(min_value=1, max_value=8), st.sampled_from([None, True, False]))
def test_topology_output_parses_to_a_verdict_or_a_gpu_query_error(text: str, tp: int, off: bool | None) -> None:
    try:
        links = gpus.parse_topology(text)
    except gpus.GpuQueryError:
        return
    check = preflight.nvlink_verdict(links, tp, off)
    assert check.level in set(preflight.Level)
    assert "?" not in check.found  # never a placeholder for a link that was not seen


@SETTINGS
@given(CSV_TEXT)
def test_capability_and_driver_csv_parse_or_are_own_errors(text: str) -> None:
    capabilities = gpus.parse_capabilities(text)
    assert all(isinstance(v, float) for v in capabilities.values())
    versions = cdi.parse_driver_versions(text)
    only_own_errors(cdi.single_driver, versions)


# --------------------------------------------------------------------------- files on the host


@SETTINGS
@given(st.one_of(st.binary(max_size=300), JSON.map(lambda v: json.dumps(v).encode())))
def test_a_cdi_stamp_of_any_bytes_is_a_stamp_or_an_own_error(scratch: Path, data: bytes) -> None:
    path = scratch / "cdi.json"
    path.write_bytes(data)
    stamp = only_own_errors(cdi.read_stamp, path)
    assert stamp is None or all(isinstance(v, str) and v for v in stamp.to_json().values())


@SETTINGS
@given(st.binary(max_size=200))
def test_a_token_file_of_any_bytes_is_a_token_or_an_own_error(scratch: Path, data: bytes) -> None:
    path = scratch / "token"
    path.write_bytes(data)
    path.chmod(0o600)
    token = only_own_errors(fetch.read_token, path)
    assert token is None or (token and len(token.split()) == 1)


@SETTINGS
@given(st.one_of(st.text(max_size=60), st.from_regex(r"(https?|ftp)?(://)?[a-z0-9.:\[\]@?#/-]{0,30}", fullmatch=True)))
def test_an_endpoint_of_any_text_is_a_base_url_or_a_usage_error(text: str) -> None:
    url = only_own_errors(fetch.endpoint_url, text)
    assert url is None or url.startswith(("http://", "https://"))


def _manifest(value: Any) -> bytes:
    return json.dumps(value).encode()


MANIFESTS = st.one_of(
    st.binary(max_size=200),
    JSON.map(_manifest),
    st.dictionaries(st.text(max_size=10), JSON, max_size=3).map(lambda m: _manifest({"models": m})),
    st.dictionaries(
        st.sampled_from(["org/model", "a/b"]),
        st.fixed_dictionaries({}, optional={"revision": JSON, "files": JSON}),
        max_size=2,
    ).map(lambda m: _manifest({"models": m})),
)


@SETTINGS
@given(MANIFESTS)
def test_an_archive_manifest_of_any_bytes_is_read_or_an_own_error(scratch: Path, data: bytes) -> None:
    (scratch / store.MANIFEST).write_bytes(data)
    models = only_own_errors(store.read_manifest, scratch)
    if models is not None:
        for entry in models.values():
            assert isinstance(entry["revision"], str) and "/" not in entry["revision"]


@SETTINGS
@given(st.one_of(st.binary(max_size=200), JSON.map(lambda v: json.dumps(v).encode())))
def test_a_hash_cache_of_any_bytes_is_ignored_entry_by_entry_never_raised(scratch: Path, data: bytes) -> None:
    (scratch / hashcache.STATE_DIR).mkdir(exist_ok=True)
    (scratch / hashcache.STATE_DIR / hashcache.STATE_FILE).write_bytes(data)
    state = hashcache.load(scratch)
    for entry in state.values():
        assert type(entry["size"]) is int and isinstance(entry["sha256"], str)


REPORTS = st.one_of(
    st.binary(max_size=200),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"verdict": st.sampled_from(["pass", "fail", None])}, optional={"served": JSON, "finished_at": JSON}
    ).map(lambda v: json.dumps(v).encode()),
)


@SMALL
@given(st.lists(REPORTS, min_size=1, max_size=3))
def test_prune_over_gate_reports_of_any_bytes_prunes_or_is_an_own_error(scratch: Path, reports: list[bytes]) -> None:
    host = layout.HostLayout.of(models=scratch / "models", serving=scratch / "serving", state=scratch / "state")
    for i, report in enumerate(reports):
        (host.runs / f"run-{i}").mkdir(parents=True, exist_ok=True)
        (host.runs / f"run-{i}" / "gate.json").write_bytes(report)
    only_own_errors(store.prune, host, 2, check=True)
