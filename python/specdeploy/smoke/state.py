"""What one smoke run holds while its checks run: the options, the engine's client, the answers the
checks asked for (each check after them re-reads them), and the report. The checks (smoke.checks)
and the orchestration (smoke.run) sit above this module; it imports neither.

Inputs are checked when a run is built (issue 20, D5/D8): the endpoint must be a base URL and a
--golden transcript is read and validated before any check runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from specdeploy.core import progress as steps
from specdeploy.core.verdicts import EXIT_CODES, Stage, Verdict, worst
from specdeploy.profile import KnownAnswer, Profile
from specdeploy.smoke import acceptance, transcript
from specdeploy.smoke.clients import Completion, EngineClient, client_for
from specdeploy.smoke.clients import endpoint_problem as _endpoint_problem


@dataclass
class SmokeReport:
    profile: str
    endpoint: str
    stages: list[Stage] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0

    @property
    def verdict(self) -> Verdict:
        """fail beats could-not-test beats inconclusive: a decisive failure stays decisive
        even if the server dies afterwards."""
        return worst(s.status for s in self.stages)

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
            "stages": [s.to_json() for s in self.stages],
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
        "verdict": Verdict.running.value,
        "exit_code": None,
        "stages": [],
        "diagnosis": [],
        "message": "the smoke is running (a process that died leaves this: no verdict)",
    }


class _Observed(Progress):
    """The smoke's bars (shown on a terminal) that also tell the current progress step what they count
    (core.progress): a gate without a terminal, as its unit runs it in a deploy, says every 20 s which
    check runs and how far it is (`smoke: coherence prompts 7/12`). The step is the one current where the
    bars are made: the concurrency and lossless checks advance them from their thread pools' workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step = steps.current()

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> Any:
        task = super().add_task(description, *args, **kwargs)
        self._tell(task)
        return task

    def update(self, task_id: Any, *args: Any, **kwargs: Any) -> None:
        super().update(task_id, *args, **kwargs)
        self._tell(task_id)

    def advance(self, task_id: Any, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._tell(task_id)

    def _tell(self, task_id: Any) -> None:
        task = next((t for t in self.tasks if t.id == task_id), None)
        if task is not None:
            count = f" {task.completed:g}/{task.total:g}" if task.total else ""
            if self._step is not None:
                self._step.observe(f"smoke: {task.description}{count}")


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


@dataclass(frozen=True)
class Answer:
    """One greedy chat answer the smoke asked for, kept for the checks that re-read it."""

    label: str  # a known answer's name, or free_form[i]
    prompt: str
    completion: Completion
    concurrency: int  # requests in flight when it was asked (1: one at a time)


class Smoke:
    """One smoke run: the client, what the checks found so far, and the report."""

    def __init__(self, profile: Profile, endpoint: str, options: SmokeOptions) -> None:
        self.profile = profile
        self.spec = profile.smoke
        self.options = options
        self.endpoint = endpoint
        # the inputs, before any stage: a golden transcript that cannot be used ends here
        self.golden_record = transcript.load_golden(options.golden) if options.golden else None
        self.endpoint_problem = _endpoint_problem(endpoint)
        self._client: EngineClient | None = None
        self.report = SmokeReport(profile.name, endpoint)
        self.outputs: dict[str, str] = {}  # prompt -> its greedy answer at concurrency 1 (the golden's)
        self.answers: list[Answer] = []  # every greedy chat answer, at concurrency 1 and above
        self.answer_counters: acceptance.Sample | None = None  # what the concurrency-1 answers moved
        self.acceptance_estimate: acceptance.Estimate | None = None
        self.served_k: int | None = None  # the served draft count, where identity could read it
        self.acceptance_texts: list[str] = []

    def gsm8k_answers(self) -> list[KnownAnswer]:
        """The profile's GSM8K questions as known answers (none without a gsm8k section)."""
        from specdeploy.smoke import gsm8k

        return gsm8k.questions(self.spec.gsm8k) if self.spec.gsm8k is not None else []

    def known_answers(self) -> list[KnownAnswer]:
        """Every prompt with a checkable answer: the profile's known answers, then its GSM8K questions."""
        return [*self.spec.prompts.known_answers, *self.gsm8k_answers()]

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

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def progress(self) -> Progress:
        return _Observed(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not self.options.show_progress,
            transient=True,
        )

    def ask(self, label: str, prompt: str, max_tokens: int, *, concurrency: int = 1) -> Completion:
        """One greedy chat answer with its token ids, kept for the checks that re-read it."""
        done = self.client.chat(prompt, max_tokens=max_tokens, template_kwargs=self.spec.chat_template_kwargs)
        if concurrency == 1:
            self.outputs[prompt] = done.text
        self.answers.append(Answer(label, prompt, done, concurrency))
        return done
