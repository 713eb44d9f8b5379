"""The smoke gate: is this endpoint serving the profile's stack, coherently, at the
acceptance the profile expects? Every deploy passes it before traffic.

Stages run in order and each reports pass / fail / error (could not test) / inconclusive /
skipped: readiness, identity, coherence (known answers + degeneracy detectors), golden
transcript, acceptance (sequential, bootstrap over waves), throughput. A failure ends with
a diagnosis that names the likely cause and the next step, because the field failures this
catches were each found only by a person reading logs.

Exit codes: 0 pass, 1 fail, 2 could not test (unreachable, server errors, an answer that is not
the engine API's), 3 inconclusive.

Inputs are checked before the first stage (issue 20, D5/D8): the endpoint must be a base URL
(a scheme, no /v1: else readiness ends at once, saying so) and a --golden transcript is read
and validated when the smoke is built, not after three stages ran. Readiness reports the last
concrete reason it was not ready (refused, timed out, the HTTP status and the first bytes of
the body). An answer with an unexpected body ends its stage as "could not test" naming the
endpoint and what was found, never a traceback.
"""

from __future__ import annotations

import ast
import contextlib
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from specdeploy.core import atomic, files
from specdeploy.core.errors import InputFileError, WriteError
from specdeploy.engine import startup_log
from specdeploy.images.guards import same_release
from specdeploy.profile import KnownAnswer, Profile
from specdeploy.smoke import acceptance, coherence
from specdeploy.smoke.clients import (
    Completion,
    EngineClient,
    EngineResponseError,
    EngineUnavailable,
    client_for,
    endpoint_problem,
)


class Status(StrEnum):
    passed = "pass"
    failed = "fail"
    error = "error"
    inconclusive = "inconclusive"
    skipped = "skipped"


EXIT_CODES = {Status.passed: 0, Status.failed: 1, Status.error: 2, Status.inconclusive: 3}


@dataclass
class Stage:
    name: str
    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    hint: str | None = None  # what to do, for a stage that could not test


class Interrupted(BaseException):
    """SIGTERM (from Ansible, systemd or `timeout`) arrived while a smoke or gate ran."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM into an exception, so a report is written before the process ends."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class SmokeReport:
    profile: str
    endpoint: str
    stages: list[Stage] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0

    @property
    def verdict(self) -> Status:
        """fail beats could-not-test beats inconclusive: a decisive failure stays decisive
        even if the server dies afterwards."""
        statuses = {s.status for s in self.stages}
        for status in (Status.failed, Status.error, Status.inconclusive):
            if status in statuses:
                return status
        return Status.passed

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "endpoint": self.endpoint,
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 2),
            "stages": [asdict(s) | {"status": s.status.value} for s in self.stages],
            "diagnosis": self.diagnosis,
        }

    def ended(self, verdict: str, exit_code: int, message: str) -> dict[str, Any]:
        """The report of a smoke that ended outside its stages (interrupted, a bug): the stages it
        finished, and the verdict and exit code the process ends with."""
        self.elapsed_s = time.monotonic() - self.started
        return self.to_json() | {"verdict": verdict, "exit_code": exit_code, "message": message}


def running_report(profile: str, endpoint: str) -> dict[str, Any]:
    """What a report file holds while its smoke runs: never a stale earlier verdict."""
    return {
        "profile": profile,
        "endpoint": endpoint,
        "verdict": "running",
        "exit_code": None,
        "stages": [],
        "diagnosis": [],
        "message": "the smoke is running (a process that died leaves this: no verdict)",
    }


@dataclass(frozen=True)
class SmokeOptions:
    golden: Path | None = None
    record_golden: Path | None = None
    api_key: str | None = None
    show_progress: bool = True
    readiness_timeout_s: float | None = None
    # Why the engine stopped trying to serve (the gate probes its unit), or None: readiness
    # ends at once instead of polling a crash-looping engine for the whole timeout.
    engine_down: Callable[[], str | None] | None = None
    # The engine's startup log (the gate reads the unit's journal or a saved log): the served
    # speculative method comes from it; vLLM's HTTP API does not say it.
    startup_log: Callable[[], str] | None = None


# --------------------------------------------------------------------------- known answers


def _strip_fences(text: str) -> str:
    match = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)```", text, re.S)
    return match.group(1) if match else text.strip()


def check_answer(answer: KnownAnswer, text: str) -> str | None:
    """None if the answer is right, else what is wrong with it."""
    if answer.expect == "contains":
        assert answer.value is not None
        return None if answer.value.lower() in text.lower() else f"expected {answer.value!r} in {text[:80]!r}"
    body = _strip_fences(text)
    if answer.expect == "json_object":
        start, end = body.find("{"), body.rfind("}")
        try:
            parsed = files.loads(body[start : end + 1]) if start >= 0 < end else None
        except files.JSONTextError as exc:  # the model's answer: a wrong answer, never a crash
            return f"not a JSON object ({exc.detail}): {text[:80]!r}"
        return None if isinstance(parsed, dict) else f"no JSON object in {text[:80]!r}"
    try:
        ast.parse(body)
    except SyntaxError as exc:
        return f"code does not parse ({exc.msg}, line {exc.lineno}): {text[:80]!r}"
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting past the parser's limits
        return f"code does not parse ({type(exc).__name__}): {text[:80]!r}"
    return None


# --------------------------------------------------------------------------- golden


def golden_tokens(text: str) -> list[str]:
    """Engine-independent tokens for prefix comparison: ASCII words, else single characters."""
    return re.findall(r"[A-Za-z0-9_]+|\S", text)


def agrees(alone: str, concurrent: str, n: int) -> bool:
    """Two outputs of one greedy prompt agree when their first `n` tokens match (vLLM's CI compares
    the first 10 generated tokens); outputs shorter than `n` must match whole."""
    return golden_tokens(alone)[:n] == golden_tokens(concurrent)[:n]


# --------------------------------------------------------------------------- served speculation

# Method names an engine reports for a profile's method: SGLang turns NEXTN into EAGLE when it parses
# its arguments (sglang/srt/server_args.py), so a NEXTN profile is served as "EAGLE".
SERVED_METHOD = {"NEXTN": "EAGLE"}
NEXTN_DRAFT_PATH = "sgl-project/sglang#23859"
# At or below this acceptance length speculation does nothing (1.0: one token per verify step).
INACTIVE_ACCEPTANCE = 1.05


def speculation_mismatch(profile: Profile, served: dict[str, Any]) -> str | None:
    """Why the served speculative setup is not the profile's (naming both values), or None."""
    spec = profile.engine.speculative
    want_k, method, k = spec.num_speculative_tokens, served.get("method"), served.get("k")
    where = "; ".join(served.get("sources") or ())
    if k == 0:
        return (
            f"the server speculates with nothing (speculative decoding is off: {where}); the profile's method is "
            f"{spec.method!r} with num_speculative_tokens {want_k}"
        )
    if method is not None and SERVED_METHOD.get(method, method) != SERVED_METHOD.get(spec.method, spec.method):
        return f"served speculative method {method!r}, the profile's is {spec.method!r} ({where})"
    if k is not None and k != want_k:
        why = (
            f"{k - want_k} more draft token(s) per step than the profile's: drafts past the positions that are "
            "accepted waste compute (the field ran 15 instead of 5)"
            if k > want_k
            else "fewer draft tokens than the profile's: acceptance and speed are not the verified setup's"
        )
        return f"served num_speculative_tokens {k}, the profile pins {want_k}: {why} ({where})"
    if profile.engine.kind == "sglang" and spec.method in ("EAGLE", "NEXTN") and not served.get("draft_model_path"):
        return (
            "SGLang serves without speculative_draft_model_path: NEXTN on Qwen3.5/3.6 then runs without "
            f"speculation, silently ({NEXTN_DRAFT_PATH}); the unit must pass --speculative-draft-model-path ({where})"
        )
    return None


GOLDEN = "golden transcript"
GOLDEN_HINT = (
    "pass the file a verified deploy recorded with `specdeploy smoke --record-golden PATH`, or record one again"
)


def load_golden(path: Path) -> dict[str, Any]:
    """A golden transcript, read and checked before any stage runs (issue 20, D8): a regular
    file, JSON, an object whose `outputs` maps each prompt to its recorded text."""
    data = files.read_json(path, what=GOLDEN, hint=GOLDEN_HINT)
    record = files.expect_mapping(data, str(path), what=GOLDEN)
    outputs = record.get("outputs")
    if not isinstance(outputs, dict) or not outputs:
        if "outputs" not in record:
            found = "no such field"
        else:
            found = "an empty object" if outputs == {} else type(outputs).__name__
        raise InputFileError(
            f"{GOLDEN} {path}: field outputs: expected an object mapping each prompt to its recorded text, "
            f"found {found}; nothing was compared",
            hint=GOLDEN_HINT,
        )
    bad = next((k for k, v in outputs.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise InputFileError(
            f"{GOLDEN} {path}: field outputs[{bad!r}]: expected the recorded text (a string), "
            f"found {type(outputs[bad]).__name__}",
            hint=GOLDEN_HINT,
        )
    return record


def _golden_compare(recorded: dict[str, Any], outputs: dict[str, str], n: int) -> tuple[float, list[str]]:
    drifted = []
    prompts = recorded["outputs"]
    for prompt, text in prompts.items():
        if prompt not in outputs or golden_tokens(outputs[prompt])[:n] != golden_tokens(text)[:n]:
            drifted.append(prompt)
    return 1 - len(drifted) / max(1, len(prompts)), drifted


# --------------------------------------------------------------------------- the run


class Smoke:
    def __init__(self, profile: Profile, endpoint: str, options: SmokeOptions) -> None:
        self.profile = profile
        self.spec = profile.smoke
        self.options = options
        self.endpoint = endpoint
        # the inputs, before any stage: a golden transcript that cannot be used ends here
        self.golden_record = load_golden(options.golden) if options.golden else None
        self.endpoint_problem = endpoint_problem(endpoint)
        self._client: EngineClient | None = None
        self.report = SmokeReport(profile.name, endpoint)
        self.outputs: dict[str, str] = {}
        self.acceptance_estimate: acceptance.Estimate | None = None
        self.served_k: int | None = None  # the served draft count, where identity could read it
        self.acceptance_texts: list[str] = []

    @property
    def client(self) -> EngineClient:
        """The engine's client, made on first use (never for an endpoint that is not a base URL)."""
        if self._client is None:
            self._client = client_for(
                self.profile.engine.kind,
                self.endpoint,
                self.profile.engine.serve.served_model_name,
                api_key=self.options.api_key,
            )
        return self._client

    def _progress(self) -> Progress:
        return Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not self.options.show_progress,
            transient=True,
        )

    def run(self) -> SmokeReport:
        stages = (
            self.readiness,
            self.identity,
            self.coherence,
            self.concurrency,
            self.golden,
            self.acceptance,
            self.long_context,
            self.throughput,
        )
        try:
            for stage in stages:
                try:
                    result = stage()
                except EngineResponseError as exc:  # answered, but not as the engine's API does
                    result = Stage(stage.__name__, Status.error, f"could not test: {exc.message}", hint=exc.hint)
                self.report.stages.append(result)
                if result.status is Status.error or (
                    result.name in ("readiness", "identity") and result.status is Status.failed
                ):
                    break
        except EngineUnavailable as exc:
            self.report.stages.append(
                Stage(
                    "server",
                    Status.error,
                    f"the server stopped answering: {exc.message}",
                    hint="read the engine log (journalctl -u specdeploy-engine) and run the smoke again",
                )
            )
        finally:
            if self._client is not None:
                self._client.close()
        self.report.diagnosis = diagnose(self)
        self.report.elapsed_s = time.monotonic() - self.report.started
        return self.report

    # ------------------------------------------------------------------ a. readiness

    def readiness(self) -> Stage:
        if self.endpoint_problem:
            return Stage(
                "readiness",
                Status.error,
                f"--endpoint {self.endpoint!r} {self.endpoint_problem}; nothing was asked",
                hint=f"pass the engine's base URL, e.g. http://127.0.0.1:{self.profile.engine.serve.port}",
            )
        timeout = self.options.readiness_timeout_s or self.spec.readiness_timeout_s
        model = self.profile.engine.serve.served_model_name
        last = "no answer yet"
        hint = "start the engine or correct --endpoint; the engine's log says why it is not serving"
        with self._progress() as progress:
            # the client (its TLS setup) and the progress line are built before the clock starts,
            # and the engine is asked at least once: on a loaded host, building them once outlasted
            # a short timeout and the smoke said "not ready" without having asked
            progress.add_task(f"waiting for {self.client.base_url} to serve {model}", total=None)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if self.options.engine_down is not None and (reason := self.options.engine_down()):
                    return Stage(
                        "readiness",
                        Status.error,
                        f"the engine stopped before it was ready: {reason}",
                        hint="read the engine log: it exits at start",
                    )
                probe = min(5.0, max(0.2, left))  # one probe never outlasts the stage's own deadline
                try:
                    self.client.check_health(timeout=probe)
                    served = self.client.served_models(timeout=probe)
                except EngineUnavailable as exc:
                    last = exc.message
                else:
                    if model in served:
                        summary = f"/health ok, /v1/models lists {model}"
                        return Stage("readiness", Status.passed, summary, {"ready_at": time.time()})
                    last = f"GET {self.client.base_url}/v1/models lists {served}, not {model}"
                    hint = f"serve {model} (the profile's engine.serve.served_model_name) or correct --endpoint"
                if deadline - time.monotonic() <= 0:
                    break
                time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
        return Stage("readiness", Status.error, f"not ready within {timeout:g}s; last: {last}", hint=hint)

    # ------------------------------------------------------------------ b. identity

    def identity(self) -> Stage:
        ident = self.client.identity()
        pinned = self.profile.engine.source.version
        details = {"engine": ident.kind, "version": ident.version, "profile_version": pinned.value}
        if ident.kind != self.profile.engine.kind:
            return Stage(
                "identity",
                Status.failed,
                f"the server is {ident.kind}, the profile is {self.profile.engine.kind}",
                details,
            )
        bad = self.profile.engine.known_bad_entry(version=ident.version)
        if bad is not None:
            return Stage("identity", Status.failed, f"{ident.kind} {ident.version} is {bad.describe()}", details)
        if pinned.resolved and not same_release(ident.version, str(pinned.value)):  # 0.29.0+cu129 is 0.29.0
            return Stage(
                "identity",
                Status.failed,
                f"{ident.kind} version {ident.version}, profile pins {pinned.value} ({pinned.provenance})",
                details,
            )
        served = self._served_speculation()
        details["speculation"] = served
        self.served_k = served["k"]
        if problem := speculation_mismatch(self.profile, served):
            details["mismatch"] = "speculation"
            return Stage("identity", Status.failed, problem, details)
        setup = f"{served['method'] or self.profile.engine.speculative.method} k={served['k']}"
        return Stage("identity", Status.passed, f"{ident.kind} {ident.version} as pinned, speculating {setup}", details)

    def _served_speculation(self) -> dict[str, Any]:
        """What the server speculates with, merged from its API (k; SGLang: the method and the draft
        path too) and, where the gate gave it, the startup log (vLLM's method)."""
        api = self.client.served_speculation()
        merged = {"method": api.method, "k": api.k, "draft_model_path": api.draft_model_path, "sources": [api.source]}
        if self.options.startup_log is not None:
            logged = startup_log.served_speculation(self.options.startup_log())
            if logged is None:
                merged["sources"].append("the startup log: no speculative_config line (method not checked)")
            else:
                merged["sources"].append(logged.source)
                merged["method"] = logged.method
                if merged["k"] is None or logged.k == 0:
                    merged["k"] = logged.k
        return merged

    # ------------------------------------------------------------------ c. coherence

    def coherence(self) -> Stage:
        prompts = self.spec.prompts
        kwargs = self.spec.chat_template_kwargs
        wrong: dict[str, str] = {}
        degenerate: dict[str, list[str]] = {}
        total = len(prompts.known_answers) + len(prompts.free_form)
        with self._progress() as progress:
            task = progress.add_task("coherence prompts", total=total)
            for answer in prompts.known_answers:
                done = self._chat(answer.prompt, answer.max_tokens, kwargs)
                if problem := check_answer(answer, done.text):
                    wrong[answer.name] = problem
                if findings := coherence.detect(done.text):
                    degenerate[answer.name] = [f"{f.detector}: {f.detail}" for f in findings]
                progress.advance(task)
            for i, prompt in enumerate(prompts.free_form):
                done = self._chat(prompt, self.spec.max_tokens, kwargs)
                if findings := coherence.detect(done.text):
                    degenerate[f"free_form[{i}]"] = [f"{f.detector}: {f.detail}" for f in findings]
                progress.advance(task)
        details = {"wrong_answers": wrong, "degenerate": degenerate, "outputs": self.outputs}
        if not wrong and not degenerate:
            return Stage("coherence", Status.passed, f"{total} prompts: answers right, no degeneracy", details)
        first = next(iter(wrong.values()), None) or next(iter(degenerate.values()))[0]
        return Stage(
            "coherence",
            Status.failed,
            f"{len(wrong)} wrong answer(s), {len(degenerate)} degenerate output(s) of {total}; e.g. {first}",
            details,
        )

    def _chat(self, prompt: str, max_tokens: int, kwargs: dict[str, Any]) -> Completion:
        done = self.client.chat(prompt, max_tokens=max_tokens, template_kwargs=kwargs)
        self.outputs[prompt] = done.text
        return done

    # ------------------------------------------------------------------ c2. concurrency

    def concurrency(self) -> Stage:
        """The coherence prompts again, each twice, with `smoke.concurrency` requests in flight: the
        known answers must still be right and the detectors clean (else fail); agreement with the
        concurrency-1 outputs over the first N tokens below the profile's floor alone is inconclusive
        (batching changes greedy outputs on GPUs)."""
        c = self.spec.concurrency
        floor = self.spec.concurrency_agreement
        if c <= 1 or floor is None:
            return Stage("concurrency", Status.skipped, "smoke.concurrency is 1: coherence ran one request at a time")
        prompts = self.spec.prompts
        kwargs = self.spec.chat_template_kwargs
        jobs: list[tuple[str, str, int, KnownAnswer | None]] = [
            (a.name, a.prompt, a.max_tokens, a) for a in prompts.known_answers
        ] + [(f"free_form[{i}]", p, self.spec.max_tokens, None) for i, p in enumerate(prompts.free_form)]
        jobs = jobs * max(2, -(-c // len(jobs)))  # every prompt at least twice, at least c requests
        in_flight = peak = 0
        lock = threading.Lock()

        def ask(job: tuple[str, str, int, KnownAnswer | None]) -> Completion:
            nonlocal in_flight, peak
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            try:
                return self.client.chat(job[1], max_tokens=job[2], template_kwargs=kwargs)
            finally:
                with lock:
                    in_flight -= 1

        with self._progress() as progress:
            task = progress.add_task(f"coherence at concurrency {c}", total=len(jobs))
            done: list[Completion] = []
            with ThreadPoolExecutor(max_workers=c) as pool:
                for completion in pool.map(ask, jobs):
                    done.append(completion)
                    progress.advance(task)
        wrong: dict[str, str] = {}
        degenerate: dict[str, list[str]] = {}
        differ: list[str] = []
        for (name, prompt, _, answer), completion in zip(jobs, done, strict=True):
            if answer is not None and (problem := check_answer(answer, completion.text)):
                wrong.setdefault(name, problem)
            if findings := coherence.detect(completion.text):
                degenerate.setdefault(name, [f"{f.detector}: {f.detail}" for f in findings])
            alone = self.outputs.get(prompt)
            if alone is None or not agrees(alone, completion.text, floor.prefix_tokens):
                differ.append(name)
        fraction = 1 - len(differ) / len(jobs)
        details = {
            "concurrency": c,
            "max_in_flight": peak,
            "requests": len(jobs),
            "wrong_answers": wrong,
            "degenerate": degenerate,
            "agreement": fraction,
            "agreement_floor": floor.min_fraction,
            "prefix_tokens": floor.prefix_tokens,
            "differing": sorted(set(differ)),
        }
        agreement = (
            f"first {floor.prefix_tokens} tokens agree with concurrency 1 on {fraction:.0%} of {len(jobs)} "
            f"(floor {floor.min_fraction:.0%}, {floor.provenance.value})"
        )
        if wrong or degenerate:
            first = next(iter(wrong.values()), None) or next(iter(degenerate.values()))[0]
            return Stage(
                "concurrency",
                Status.failed,
                f"at concurrency {c}: {len(wrong)} wrong answer(s), {len(degenerate)} degenerate output(s); "
                f"e.g. {first}; {agreement}",
                details,
            )
        if fraction < floor.min_fraction:
            return Stage(
                "concurrency",
                Status.inconclusive,
                f"answers right and clean at {c} in flight, but {agreement}",
                details,
            )
        return Stage(
            "concurrency",
            Status.passed,
            f"{len(jobs)} requests, {peak} in flight: answers right, clean; {agreement}",
            details,
        )

    # ------------------------------------------------------------------ golden

    def golden(self) -> Stage:
        n = self.spec.golden_prefix_tokens
        if self.options.record_golden:
            record = {
                "profile": self.profile.name,
                "engine_version": str(self.profile.engine.source.version.value),
                "prefix_tokens": n,
                "outputs": self.outputs,
            }
            path = self.options.record_golden
            try:
                atomic.ensure_dir(path.parent)
                atomic.write_json(path, record)
            except WriteError as exc:
                summary = f"could not record the golden transcript: {exc.message}"
                return Stage("golden", Status.error, summary, hint=exc.hint)
            return Stage("golden", Status.passed, f"recorded {len(self.outputs)} outputs to {path}")
        if self.golden_record is None:
            return Stage("golden", Status.skipped, "no --golden transcript given")
        recorded = self.golden_record
        fraction, drifted = _golden_compare(recorded, self.outputs, n)
        floor = self.spec.golden_match_fraction_min
        details = {"match_fraction": fraction, "drifted_prompts": drifted, "floor": floor}
        status = Status.passed if fraction >= floor else Status.failed
        return Stage(
            "golden",
            status,
            f"first {n} tokens match on {fraction:.0%} of {len(recorded['outputs'])} prompts (floor {floor:.0%})",
            details,
        )

    # ------------------------------------------------------------------ d. acceptance

    def acceptance(self) -> Stage:
        band = self.spec.acceptance_length
        prompts = self.spec.prompts.acceptance
        wave = self.spec.wave_size
        samples: list[acceptance.Sample] = []
        other = used = 0
        decision = acceptance.Decision.undecided
        est = acceptance.estimate([])
        with self._progress() as progress:
            task = progress.add_task("acceptance (sequential)", total=self.spec.max_requests)
            while used + wave <= self.spec.max_requests:
                batch = [prompts[(used + i) % len(prompts)] for i in range(wave)]
                result = self.client.acceptance_wave(batch, max_tokens=self.spec.acceptance_max_tokens)
                used += wave
                other += result.other_requests
                samples.append(result.sample)
                self.acceptance_texts += [c.text for c in result.completions]
                progress.update(task, completed=used)
                est = acceptance.estimate(samples)
                if est.drafts == 0 and len(samples) >= self.spec.min_samples:
                    break
                decision = acceptance.decide(est, band.min, band.max, min_samples=self.spec.min_samples)
                if decision is not acceptance.Decision.undecided:
                    break
        self.acceptance_estimate = est
        details = {
            "mean_acceptance_length": est.mean_acceptance_length,
            "interval_95": [est.low, est.high],
            "band": [band.min, band.max],
            "draft_acceptance_rate": est.draft_acceptance_rate,
            "per_position": list(est.per_position),
            "drafts": est.drafts,
            "requests": used,
            "waves": len(samples),
            "decision": decision.value,
            "other_traffic_requests": other,
        }
        interval = f"{est.mean_acceptance_length:.2f} [{est.low:.2f}, {est.high:.2f}]"
        where = f"band [{band.min}, {band.max}], {used} requests in {len(samples)} waves"
        if other:
            where += f"; {other} other request(s) seen on the server during the smoke"
        if est.drafts == 0:
            return Stage("acceptance", Status.failed, f"no drafts at all over {used} requests ({where})", details)
        want_k = self.profile.engine.speculative.num_speculative_tokens
        if self.served_k is None and est.per_position and len(est.per_position) != want_k:
            # identity could not read k (no position labels before the first request): the waves' own counters tell
            served = {
                "method": None,
                "k": len(est.per_position),
                "sources": ["the acceptance waves' per-position counter"],
            }
            details["mismatch"] = speculation_mismatch(self.profile, served)
            return Stage("acceptance", Status.failed, str(details["mismatch"]), details)
        if est.mean_acceptance_length <= INACTIVE_ACCEPTANCE and not est.per_position:
            # SGLang (no per-position counts): one token per verify step is speculation doing nothing. vLLM's
            # per-position rates tell a drafter proposing wrong tokens (the field's config) apart: below.
            return Stage(
                "acceptance",
                Status.failed,
                f"mean acceptance length {interval}: speculation inactive (~1 token per verify step; {where})",
                details,
            )
        loop = self._looks_like_loop(est) or decision is acceptance.Decision.above
        details["token_loop"] = loop
        if decision is acceptance.Decision.inside and not loop:
            return Stage("acceptance", Status.passed, f"mean acceptance length {interval} inside {where}", details)
        if decision is acceptance.Decision.below:
            return Stage("acceptance", Status.failed, f"mean acceptance length {interval} below {where}", details)
        if decision is acceptance.Decision.above or loop:
            return Stage(
                "acceptance",
                Status.failed,
                f"mean acceptance length {interval} above {where}: a token loop?",
                details,
            )
        return Stage(
            "acceptance",
            Status.inconclusive,
            f"mean acceptance length {interval} undecided after {where}",
            details,
        )

    def _looks_like_loop(self, est: acceptance.Estimate) -> bool:
        """Every position ~100% together with repetitive text: the signature of a token loop."""
        saturated = bool(est.per_position) and min(est.per_position) >= 0.95
        repetitive = sum(1 for t in self.acceptance_texts if coherence.detect(t)) >= len(self.acceptance_texts) / 2
        return saturated and repetitive

    # ------------------------------------------------------------------ e2. long context

    def long_context(self) -> Stage:
        """One request whose prompt crosses `position` tokens, acceptance measured on what it decodes
        after it (vllm-project/vllm#52873: acceptance fell to 0% engine-wide past 32768)."""
        probe = self.spec.long_context
        if probe is None or not probe.enabled:
            return Stage("long_context", Status.skipped, "the profile's long-context probe is off")
        result = self.client.long_context_wave(probe.position, max_tokens=probe.max_tokens)
        est = acceptance.estimate([result.sample])
        details = {
            "position": probe.position,
            "prompt_tokens": result.prompt_tokens,
            "mean_acceptance_length": est.mean_acceptance_length,
            "drafts": est.drafts,
            "floor": probe.acceptance_length_min,
        }
        if result.prompt_tokens is not None and result.prompt_tokens < probe.position:
            return Stage(
                "long_context",
                Status.error,
                f"the probe's prompt had {result.prompt_tokens} tokens, short of position {probe.position}",
                details,
                hint="the engine tokenized the probe shorter than expected: report it as a specdeploy bug",
            )
        summary = (
            f"after crossing position {probe.position}: mean acceptance length {est.mean_acceptance_length:.2f} "
            f"over {est.drafts:.0f} drafts (floor {probe.acceptance_length_min})"
        )
        if est.drafts == 0 or est.mean_acceptance_length < probe.acceptance_length_min:
            return Stage("long_context", Status.failed, summary, details)
        return Stage("long_context", Status.passed, summary, details)

    # ------------------------------------------------------------------ f. throughput

    def throughput(self) -> Stage:
        prompt = self.spec.prompts.acceptance[0]
        result = self.client.stream_completion(
            prompt, max_tokens=self.spec.acceptance_max_tokens, min_tokens=self.spec.decode_rate_min_tokens
        )
        details = asdict(result)
        rate = result.decode_tokens_per_s
        floor = self.spec.decode_tokens_per_s_min
        ttft = f"TTFT {result.ttft_s * 1000:.0f} ms" if math.isfinite(result.ttft_s) else "no first token"
        if rate is None:
            summary = f"{ttft}; decode rate not measurable: {result.note}"
            status = Status.passed if floor is None else Status.inconclusive
            return Stage("throughput", status, summary, details)
        summary = f"{ttft}, decode {rate:.1f} tok/s over {result.tokens} tokens ({result.measured_by})"
        if floor is None:
            return Stage("throughput", Status.passed, summary + " (no floor in the profile)", details)
        if rate >= floor:
            return Stage("throughput", Status.passed, f"{summary} >= floor {floor}", details)
        return Stage("throughput", Status.failed, f"{summary} < floor {floor}", details)


# --------------------------------------------------------------------------- e. diagnosis


def diagnose(smoke: Smoke) -> list[str]:
    """Turn stage results into the likely cause and the next step."""
    report, profile = smoke.report, smoke.profile
    out: list[str] = []
    stage = report.stage
    names = ("readiness", "identity", "coherence", "golden", "acceptance", "throughput")  # and more below
    ready, ident, coh, gold, acc, thr = (stage(n) for n in names)
    server = stage("server")
    unexpected = [s for s in report.stages if s.status is Status.error and s.summary.startswith("could not test:")]
    if smoke.endpoint_problem:
        out.append(f"endpoint: {report.endpoint!r} is not an engine's base URL: nothing was asked of it")
    elif unexpected:
        out.append(
            f"unexpected answer at {unexpected[0].name}: whatever answers at {report.endpoint} does not speak the "
            "engine's API as the profile pins it — check the endpoint (base URL, no proxy page) and the engine"
        )
    elif ready and ready.status is Status.error:
        out.append(
            "unreachable: the server is down, still loading, or serves another model name — "
            "check the service and its log"
        )
    if server is not None:
        out.append(
            "the server failed mid-run (connection lost or HTTP 5xx): read the engine log; "
            "the results above are partial"
        )
    if ident and ident.status is Status.failed and ident.details.get("mismatch") == "speculation":
        out.append(
            f"speculative setup: {ident.summary} — the engine runs another command line than the profile's: "
            "reinstall the unit from the profile (`specdeploy unit render` shows the command) and restart it"
        )
    elif ident and ident.status is Status.failed:
        out.append(
            "engine identity: the endpoint runs a different engine/version than the profile pins — "
            "rebuild or pull the pinned image (specdeploy image check) before trusting any other result"
        )
    conc = stage("concurrency")
    if conc and conc.status is Status.failed and coh is not None and coh.status is Status.passed:
        out.append(
            f"corrupt under concurrency: answers right one at a time but not with {conc.details.get('concurrency')} "
            "in flight — suspect the engine's batched kernels or too many draft tokens (the field's drafter at 15 "
            "tokens: 32/32 at concurrency 1, 11/32 at 4); do not serve it"
        )
    elif conc and conc.status is Status.inconclusive:
        out.append(
            "concurrent outputs differ from the sequential ones beyond the reported floor, while right and clean: "
            "batching numerics, or a corruption starting — run the gate again and compare with the golden"
        )
    longc = stage("long_context")
    if longc and longc.status is Status.failed:
        out.append(
            f"long context: acceptance collapsed after position {longc.details.get('position')} "
            "(vllm-project/vllm#52873 saw 0% engine-wide past 32768) — the engine version is suspect"
        )
    if thr and thr.status is Status.inconclusive:
        out.append(f"throughput not measured: {thr.summary}; the profile's floor was not checked")
    est = smoke.acceptance_estimate
    incoherent = coh is not None and coh.status is Status.failed
    measured = acc is not None and acc.status not in (Status.passed, Status.skipped) and est is not None
    loop = bool(acc and acc.details.get("token_loop"))
    if loop:
        out.append(
            "token loop: every draft position accepted ~100% while the text repeats — the target is "
            "degenerate (engine version, kernels or weights), not the drafter"
        )
    elif incoherent and acc is not None and acc.status is Status.passed:
        out.append(
            "acceptance fine but output incoherent: suspect the engine version or its kernels "
            "(known-bad versions, attention backend), not the drafter"
        )
    elif incoherent:
        out.append(
            "output incoherent: the target itself is broken (engine version, kernels, target weights or "
            "revision); a broken target also rejects drafts, so fix this before judging acceptance"
        )
    if measured and est is not None and not loop:
        decision = acc.details.get("decision")
        if est.drafts == 0 or (est.mean_acceptance_length <= INACTIVE_ACCEPTANCE and not est.per_position):
            out.append(
                "no drafts: speculative decoding is not enabled on this server — check the engine's "
                f"--speculative-config (profile method {profile.engine.speculative.method!r})"
                if est.drafts == 0
                else f"speculation inactive: acceptance length {est.mean_acceptance_length:.2f} (~1 token per "
                "verify step) — every draft is rejected or none is proposed; on SGLang NEXTN check "
                f"--speculative-draft-model-path ({NEXTN_DRAFT_PATH})"
            )
        elif (
            decision == "below"
            and not incoherent
            and (not est.per_position or est.per_position[0] < profile.smoke.position0_acceptance_min)
        ):
            first = f"{est.per_position[0]:.0%}" if est.per_position else "n/a"
            out.append(
                f"drafter config: position-0 acceptance {first} (< {profile.smoke.position0_acceptance_min:.0%}) "
                "means the drafter proposes the wrong tokens from the start — run `specdeploy verify-config` on the "
                "serving directory (mask_token_id, target_layer_ids, layer types) and check the "
                "auxiliary-layer log line"
            )
        elif decision == "below" and not incoherent:
            out.append("acceptance low but position 0 healthy: check num_speculative_tokens and the drafter revision")
    if gold and gold.status is Status.failed:
        out.append(
            "golden drift: greedy outputs changed since the golden transcript was recorded — the served "
            "model, its revision or the engine differs from the verified deploy"
        )
    if thr and thr.status is Status.failed and acc and acc.status is Status.passed:
        out.append(
            "good acceptance but low tok/s: too many draft tokens for what is accepted — lower "
            "num_speculative_tokens (the field tuned 15 -> 5)"
        )
    return out


def run(profile: Profile, endpoint: str, options: SmokeOptions | None = None) -> SmokeReport:
    return Smoke(profile, endpoint, options or SmokeOptions()).run()
