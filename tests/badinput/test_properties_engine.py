"""Property tests for the parsers of the images and engine commands (issue 20: only specdeploy's
own errors, never a traceback).

Hypothesis feeds arbitrary text to the startup-log parser (`startup-log --file`, the gate's
auxiliary-layer check), arbitrary serve args, environment and image references to the unit
renderer (`unit render|install`), arbitrary podman label output to `image check`, arbitrary
bytes to the API key reader (`engine api-key`) and arbitrary `--driver` values to the driver
check. Each either answers or raises a SpecdeployError subclass (exit 1 or 2 with a message);
a rendered unit never gains a line, a section or a directive its profile did not ask for.
Bounded: derandomized, at most 200 examples a property, each within a deadline of seconds (ample
for a slow CI machine; an unbounded parse fails).
"""

from __future__ import annotations

import io
import ipaddress
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeploy.core.errors import SpecdeployError
from specdeploy.engine import secret, startup_log, units
from specdeploy.images import build, ensure
from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import variants

# Per example: typical runs take milliseconds (--hypothesis-show-statistics); an input that makes a parser
# unbounded (D14: minutes) fails at once, while a loaded 2-core CI machine has room to spare.
DEADLINE = timedelta(seconds=2)

SETTINGS = settings(max_examples=200, deadline=DEADLINE, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
DIGEST_REF = "localhost/specdeploy-rehearsal/vllm-cpu@sha256:" + "0" * 64
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # every control character but the line feed

DFLASH = variants.dflash()
VENV = load_profile("cpu-rehearsal")
CONTAINER = load_profile("cpu-rehearsal-container")


def _shape(text: str) -> tuple[set[str], set[str]]:
    """The sections and directive keys of a unit: what an injected line would add."""
    sections = {line for line in text.splitlines() if line.startswith("[")}
    keys = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line and not line.startswith("#")}
    return sections, keys


BASE_SHAPE = {
    "venv": _shape(units.render(VENV, python="/opt/engine/bin/python").text),
    "container": _shape(units.render(CONTAINER, image=DIGEST_REF).text),
}


# --------------------------------------------------------------------------- the startup log

WORDINGS = (
    "Using auxiliary layers from speculative config: ",
    "Using Eagle3 auxiliary layers from config: ",
    "Using Eagle3 auxiliary layers from model: ",
    "Using V1 Model Runner",
    "speculative_config=SpeculativeConfig(method='",
    "speculative_config=None",
)
tuple_ish = st.text(alphabet="0123456789, ()\t\n-+x", max_size=40)
log_line = st.one_of(
    st.text(max_size=200),
    st.builds(lambda w, t: w + t, st.sampled_from(WORDINGS), tuple_ish),
    st.builds(lambda w, n: f"{w}({n},)", st.sampled_from(WORDINGS[:3]), st.integers(min_value=0, max_value=10**30)),
)
startup_logs = st.lists(log_line, max_size=12).map("\n".join)


def _checked(profile: Profile, text: str) -> None:
    try:
        check = startup_log.check_aux_layers(profile, text)
    except SpecdeployError:
        return
    assert isinstance(check.ok, bool) and isinstance(check.message, str)
    if check.found is not None:
        assert all(isinstance(i, int) and 0 <= i < 10**9 for i in check.found)


@SETTINGS
@given(startup_logs)
def test_any_text_as_a_startup_log_is_checked_or_refused_by_specdeploy_only(text: str) -> None:
    _checked(DFLASH, text)
    startup_log.describe_instead(text)


@SETTINGS
@given(st.text(max_size=300), st.sampled_from(["0", "1", None]))
def test_any_text_polled_from_a_journal_ends_in_a_check_or_specdeploy_error(text: str, runner: str | None) -> None:
    env = {"VLLM_USE_V2_MODEL_RUNNER": runner} if runner is not None else {}
    profile = variants.derive(DFLASH, DFLASH.name, {"engine": {"env": env}})
    try:
        check = startup_log.wait_for_aux_layers(profile, lambda: text, timeout_s=0, poll_s=0)
    except SpecdeployError:
        return
    assert isinstance(check.ok, bool)


@settings(
    max_examples=60, deadline=DEADLINE, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=4000))
def test_any_bytes_in_a_saved_log_file_are_read_or_refused(tmp_path: Path, data: bytes) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(data)
    try:
        text = startup_log.read_log_file(log)
    except SpecdeployError:
        return
    _checked(DFLASH, text)


# --------------------------------------------------------------------------- the unit renderer

# mostly printable text (so that most profiles validate and reach the renderer), some of any kind
texts = st.one_of(st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=30), st.text(max_size=30))
serve_patch = st.fixed_dictionaries(
    {},
    optional={
        "host": texts,
        "port": st.integers(min_value=-5, max_value=70_000),
        "served_model_name": texts,
        "tensor_parallel_size": st.integers(min_value=-1, max_value=9),
        "dtype": texts,
        "max_model_len": st.one_of(st.none(), st.integers(min_value=-1, max_value=10**6)),
        "gpu_memory_utilization": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
        "attention_backend": st.one_of(st.none(), texts),
        "enable_prefix_caching": st.one_of(st.none(), st.booleans()),
        "extra_args": st.lists(texts, max_size=5),
    },
)
env_names = st.one_of(st.from_regex(r"[A-Z_][A-Z0-9_]{0,11}", fullmatch=True), st.text(max_size=12))
engine_env = st.dictionaries(env_names, texts, max_size=4)


def _rendered(profile: Profile, runtime: str, **kwargs: Any) -> None:
    try:
        text = units.render(profile, **kwargs).text
    except SpecdeployError:
        return
    assert not CONTROL.search(text), "a control character reached the unit"
    sections, keys = _shape(text)
    base_sections, base_keys = BASE_SHAPE[runtime]
    assert sections == base_sections, f"sections changed: {sections ^ base_sections}"
    assert keys <= base_keys, f"directives injected: {keys - base_keys}"


@SETTINGS
@given(serve_patch, engine_env)
def test_any_serve_args_and_environment_render_a_unit_of_the_same_shape_or_a_specdeploy_error(
    serve: dict[str, Any], env: dict[str, str]
) -> None:
    for base, runtime, kwargs in (
        (VENV, "venv", {"python": "/opt/engine/bin/python"}),
        (CONTAINER, "container", {"image": DIGEST_REF}),
    ):
        try:
            profile = variants.derive(base, base.name, {"engine": {"serve": serve, "env": env}})
        except SpecdeployError:
            continue  # the profile's own validation refused it (exit 2)
        _rendered(profile, runtime, **kwargs)


hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)
image_refs = st.one_of(
    st.text(max_size=120),
    st.builds(lambda n, d: f"{n}@sha256:{d}", texts, st.one_of(hex64, st.text("0123456789abcdefX", max_size=70))),
    st.builds(lambda n, d: f"{n}@sha256:{d}", st.from_regex(r"[a-z0-9./:-]{1,40}", fullmatch=True), hex64),
)
listener_addresses = st.one_of(texts, st.ip_addresses().map(str), st.sampled_from(["0.0.0.0", "::", "[::]"]))


@SETTINGS
@given(image_refs)
def test_any_image_reference_renders_a_pinned_unit_published_on_loopback_only_or_a_specdeploy_error(
    image: str,
) -> None:
    try:
        text = units.render(CONTAINER, image=image).text
    except SpecdeployError:
        return
    assert units.IMAGE_BY_DIGEST.fullmatch(image) and f"Image={image}\n" in text
    assert not CONTROL.search(text)
    assert [line for line in text.splitlines() if line.startswith("PublishPort=")] == [
        f"PublishPort=127.0.0.1:{CONTAINER.engine.serve.port}:{CONTAINER.engine.serve.port}"
    ]


@SETTINGS
@given(listener_addresses)
def test_any_listener_address_is_one_internal_ip_address_or_a_specdeploy_error(address: str) -> None:
    from specdeploy.front import listener

    try:
        accepted = listener.require_address(address)
    except SpecdeployError as exc:
        assert repr(address) in exc.message
        return
    parsed = ipaddress.ip_address(accepted)
    assert not parsed.is_loopback and not parsed.is_unspecified
    text = listener.render(CONTAINER.front, address=accepted, port=8000, drain_s=600)
    assert not CONTROL.search(text) and "verify required" in text


@SETTINGS
@given(st.text(max_size=60))
def test_any_python_and_host_paths_render_or_are_refused(value: str) -> None:
    from specdeploy.core import layout

    try:
        host = layout.HostLayout.of(models=value or None, serving=value or None)
    except (SpecdeployError, ValueError):  # ValueError: a NUL in a path (pathlib refuses it before specdeploy)
        return
    _rendered(VENV, "venv", python=value or None, host=host)


# --------------------------------------------------------------------------- podman's answers, the key, the driver


@SETTINGS
@given(st.one_of(st.text(max_size=200), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=3)),
    max_leaves=10,
).map(lambda v: __import__("json").dumps(v))))  # fmt: skip
def test_any_label_output_of_podman_is_labels_or_a_specdeploy_error(printed: str) -> None:
    try:
        labels = ensure._labels(printed, "podman", "some/image")
    except SpecdeployError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_on_standard_input_are_a_key_or_a_specdeploy_error(data: bytes) -> None:
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        key = secret.read_key(stream)
    except SpecdeployError:
        return
    assert isinstance(key, str) and "\n" not in key[:-1]


@SETTINGS
@given(st.text(max_size=30))
def test_any_driver_version_is_checked_or_refused_by_specdeploy_only(driver: str) -> None:
    try:
        build.check_driver(CONTAINER, driver)
    except SpecdeployError:
        return


@pytest.mark.parametrize("size", [0, 1, 65_536, 65_537])
def test_the_key_reader_is_bounded(size: int) -> None:
    stream = io.TextIOWrapper(io.BytesIO(b"k" * size + b"\n"), encoding="utf-8")
    if size + 1 > 65_536:
        with pytest.raises(secret.KeyInputError, match="at most 65536 bytes"):
            secret.read_key(stream)
    else:
        assert secret.read_key(stream) == "k" * size + "\n"
