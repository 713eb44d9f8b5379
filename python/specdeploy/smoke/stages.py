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
import re
import signal
import time
from collections.abc import Callable, Iterator
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
            self.golden,
            self.acceptance,
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
        deadline = time.monotonic() + timeout
        model = self.profile.engine.serve.served_model_name
        last = "no answer yet"
        hint = "start the engine or correct --endpoint; the engine's log says why it is not serving"
        with self._progress() as progress:
            progress.add_task(f"waiting for {self.client.base_url} to serve {model}", total=None)
            while (left := deadline - time.monotonic()) > 0:
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
        return Stage("identity", Status.passed, f"{ident.kind} {ident.version} as pinned", details)

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

    # ------------------------------------------------------------------ f. throughput

    def throughput(self) -> Stage:
        prompt = self.spec.prompts.acceptance[0]
        result = self.client.stream_completion(prompt, max_tokens=self.spec.acceptance_max_tokens)
        details = asdict(result)
        rate = result.decode_tokens_per_s
        summary = f"TTFT {result.ttft_s * 1000:.0f} ms, decode {rate:.1f} tok/s over {result.tokens} tokens"
        floor = self.spec.decode_tokens_per_s_min
        if floor is None:
            return Stage("throughput", Status.passed, summary + " (no floor in the profile)", details)
        if result.decode_tokens_per_s >= floor:
            return Stage("throughput", Status.passed, f"{summary} >= floor {floor}", details)
        return Stage("throughput", Status.failed, f"{summary} < floor {floor}", details)


# --------------------------------------------------------------------------- e. diagnosis


def diagnose(smoke: Smoke) -> list[str]:
    """Turn stage results into the likely cause and the next step."""
    report, profile = smoke.report, smoke.profile
    out: list[str] = []
    stage = report.stage
    names = ("readiness", "identity", "coherence", "golden", "acceptance", "throughput")
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
    if ident and ident.status is Status.failed:
        out.append(
            "engine identity: the endpoint runs a different engine/version than the profile pins — "
            "rebuild or pull the pinned image (specdeploy image check) before trusting any other result"
        )
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
        if est.drafts == 0:
            out.append(
                "no drafts: speculative decoding is not enabled on this server — check the engine's "
                f"--speculative-config (profile method {profile.engine.speculative.method!r})"
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
