"""The light gate: `specdeploy watch run`, what the host's timer runs every `watch.interval_s`.

Lighter than the deploy's gate and never acting on the stack: readiness (a short wait), the
smoke's identity stage (the served engine and version, and the speculative setup: k from the
engine's per-position counters, and on vLLM the method from the unit's startup log, its journal
since the current start; SGLang's both from its server info), the profile's known answers read by
the smoke's answer checks against the profile's accuracy floor and its degeneracy detectors
(smoke.answers, smoke.checks.accuracy, smoke.coherence), and acceptance over the interval since the
previous light gate from the engine's own counters (watch.counters; SGLang exports none, so
there one wave of the profile's acceptance prompts is measured per request, as the smoke does).

Every run writes `<state>/watch/result.json` (core.layout) — `running` first, then the verdict —
and, unless the host's settings say none, the textfile (watch.textfile). When the verdict is
`fail` or `error` it calls the host's hook with the result file's path (watch.hook) and records
what the hook did. It never restarts, rolls back or changes the engine: a stack that fails here
is for a person (or the site's automation behind the hook) to act on.

Verdicts and exit codes: pass 0; fail 1 (a check failed: a wrong answer, degenerate text, another
engine or version than the profile's, acceptance collapsed below the floor, requests finished
without a draft); error 2 (could not test: the engine does not answer, answers what is not its
API, the profile or key cannot be read); skipped 0 (a deploy has replaced parts of the stack and
its gate has not ended: the light gate judges only a gated stack); 130 interrupted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files, keeper, layout
from specdeploy.core.errors import InputFileError, SpecdeployError, UsageError, WriteError
from specdeploy.core.verdicts import EXIT_CODES, Interrupted, Stage, Verdict, sigterm_interrupts
from specdeploy.engine import secret, startup_log
from specdeploy.host import command
from specdeploy.profile import Profile, load_profile
from specdeploy.smoke import answers, metrics
from specdeploy.smoke import run as smoke
from specdeploy.smoke.checks import accuracy, coherence, identity, readiness
from specdeploy.smoke.responses import EngineResponseError, EngineUnavailable
from specdeploy.watch import counters, hook, textfile

# The verdicts the hook is called for.
HOOKED = (Verdict.failed, Verdict.error)
SYSTEMCTL_TIMEOUT_S = 10


class WatchBusy(SpecdeployError):
    """Another light gate holds the lock: this one did not run (exit 2)."""

    exit_code = 2


@dataclass(frozen=True)
class WatchOptions:
    profile_file: Path | None = None  # default: the profile copy the installed engine unit names
    endpoint: str | None = None  # default: http://127.0.0.1:<the profile's port>
    unit: str = layout.UNIT_NAME
    config: hook.HostConfig = field(default_factory=hook.HostConfig)
    run_hook: bool = True
    api_key: str | None = None  # default: engine.secret.read (the host's key file, or $SPECDEPLOY_API_KEY)
    readiness_timeout_s: float | None = None  # default: the profile's watch.readiness_timeout_s
    systemctl: str = "systemctl"  # the engine unit's state (NRestarts); "" reads no unit
    unit_files: tuple[Path, ...] = tuple(layout.UNIT_FILES.values())
    clock: Callable[[], float] = time.time
    startup_log: str | None = None  # the engine's startup log; default: the unit's journal (with systemctl)


def _iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="seconds")


@dataclass
class WatchResult:
    state: str
    started_unix: float
    profile: str | None = None
    profile_file: str | None = None
    endpoint: str | None = None
    verdict: Verdict = Verdict.running
    message: str = "the light gate is running (a process that died leaves this: no verdict)"
    hint: str | None = None  # what to do, when the run itself could not test
    checks: list[Stage] = field(default_factory=list)
    counters: dict[str, Any] | None = None  # the engine's counter totals now (re-exported)
    interval: dict[str, Any] | None = None  # what they moved by since the previous light gate
    snapshot_problem: str | None = None
    engine_unit: dict[str, Any] | None = None
    watch: dict[str, Any] | None = None  # the profile's watch settings this run judged with
    config: dict[str, Any] | None = None
    textfile: dict[str, Any] | None = None
    hook: dict[str, Any] | None = None
    finished_unix: float | None = None
    error_exit: int | None = None  # set when the light gate itself failed (a bug: 70)
    started: float = field(default_factory=time.monotonic)

    @property
    def exit_code(self) -> int:
        if self.error_exit is not None and self.verdict is Verdict.error:
            return self.error_exit
        return EXIT_CODES[self.verdict]

    def check(self, name: str) -> Stage | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "profile_file": self.profile_file,
            "endpoint": self.endpoint,
            "state": self.state,
            "started_at": _iso(self.started_unix),
            "started_unix": self.started_unix,
            "finished_at": _iso(self.finished_unix) if self.finished_unix else None,
            "finished_unix": self.finished_unix,
            "elapsed_s": round(time.monotonic() - self.started, 2),
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "message": self.message,
            "hint": self.hint,
            "checks": [c.to_json() for c in self.checks],
            "counters": self.counters,
            "interval": self.interval,
            "snapshot_problem": self.snapshot_problem,
            "engine_unit": self.engine_unit,
            "watch": self.watch,
            "config": self.config,
            "textfile": self.textfile,
            "hook": self.hook,
        }


# --------------------------------------------------------------------------- inputs


def profile_file_of_unit(unit_files: tuple[Path, ...]) -> Path:
    """The profile copy the installed engine unit names (its header): what the light gate judges
    the served stack with, also after a rollback put a previous unit back."""
    unit_file = next((path for path in unit_files if path.is_file()), None)
    if unit_file is None:
        raise UsageError(
            f"no engine unit is installed here ({', '.join(map(str, unit_files))}): the light gate cannot tell "
            "which profile the engine serves",
            hint="deploy the stack first (ansible-playbook deploy.yml), or pass --profile and --endpoint",
        )
    text = files.read_text(unit_file, what="engine unit", limit=files.LIMITS["json"])
    named = layout.unit_profile_file(text)
    if named is None:
        raise UsageError(
            f"engine unit {unit_file}: expected a `{layout.UNIT_PROFILE_LINE.strip()}` header line naming the "
            "profile it was rendered from, found none",
            hint="re-run the deploy (its engine stage writes the header), or pass --profile",
        )
    return Path(named)


def _watch_settings(profile: Profile) -> dict[str, Any]:
    return {
        "interval_s": profile.watch.interval_s,
        "readiness_timeout_s": profile.watch.readiness_timeout_s,
        "acceptance_length_min": profile.watch_acceptance_floor,
        "min_drafts": profile.watch.min_drafts,
    }


def _give_back(directory: Path, *, fd: int | None = None, path: Path | None = None) -> None:
    """A light gate run as root (by hand, or `migrate finish` over SSH) leaves what it wrote to the
    account that owns the light gate's directory (the service's, core.layout.WATCH_USER), so that the
    timer's next run can still take the lock and read the counters. Nothing to do when run as that
    account, or where root owns the directory (a development checkout)."""
    if os.geteuid() != 0:
        return
    with contextlib.suppress(OSError):  # the file is still written; only its owner stays root's
        owner = directory.stat()
        if owner.st_uid == 0:
            return
        if fd is not None:
            os.fchown(fd, owner.st_uid, owner.st_gid)
        elif path is not None:
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One light gate at a time on a host (the timer's and one by hand)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise UsageError(
            f"the light gate's lock {path} cannot be opened ({exc.strerror}): "
            + ("it is a link, never followed" if exc.errno == errno.ELOOP else "another account made it")
            + "; nothing was judged",
            hint=f"run the light gate as its service does (`systemctl start "
            f"{layout.WATCH_UNIT_FILES['service'].name}`, as {layout.WATCH_USER}), or re-run the deploy's watch "
            f"stage (it gives {path.parent} back to that account)",
        ) from None
    try:
        _give_back(path.parent, fd=fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WatchBusy(
                f"another light gate is running on this host (it holds {path}); this one did not run",
                hint="wait for it to end (`systemctl status specdeploy-watch`), then run again",
            ) from None
        yield
    finally:
        os.close(fd)


def _claim(host: layout.HostLayout) -> None:
    if host.state.exists() and not host.state.is_dir():
        raise UsageError(
            f"--state-dir {host.state}: expected a directory, found a file; the light gate's result cannot be "
            "kept there",
            hint="pass the host's state directory (`specdeploy facts` shows it as paths.state)",
        )
    try:
        atomic.ensure_dir(host.watch)
    except WriteError as exc:
        raise UsageError(
            f"--state-dir {host.state}: the light gate's directory {host.watch} cannot be made ({exc.message}); "
            "nothing was judged",
            hint=f"pass a state directory this user can write to (on a host, {layout.WATCH_USER}'s: run "
            f"`systemctl start {layout.WATCH_UNIT_FILES['service'].name}`)",
        ) from None


# --------------------------------------------------------------------------- the engine unit


def unit_state(unit: str, systemctl: str = "systemctl") -> dict[str, Any]:
    """The engine unit's state and automatic restart count (`systemctl show`): what the textfile
    re-exports. Never an exception: where systemd cannot be asked, the reason."""
    state: dict[str, Any] = {"name": unit, "loaded": False}
    if not systemctl:
        return state | {"error": "not read (no systemctl given)"}
    try:
        done = command.run(
            [systemctl, "show", unit, "--property=LoadState,ActiveState,SubState,NRestarts"],
            timeout=SYSTEMCTL_TIMEOUT_S,
        )
    except command.ProgramRunError as exc:
        return state | {"error": exc.message}
    shown = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if done.returncode != 0 or shown.get("LoadState") != "loaded":
        why = shown.get("LoadState") or (done.stderr.strip()[:200] or f"systemctl exited {done.returncode}")
        if "bus" in why.lower() and os.geteuid() != 0:  # not root: systemctl asks systemd over the system bus
            why += f"; {layout.WATCH_USER} asks systemd over D-Bus: install and start dbus on this host"
        return state | {"error": f"{unit} is not loaded ({why})"}
    restarts = shown.get("NRestarts", "")
    return state | {
        "loaded": True,
        "active_state": shown.get("ActiveState"),
        "sub_state": shown.get("SubState"),
        "n_restarts": int(restarts) if restarts.isdigit() else None,
    }


# --------------------------------------------------------------------------- the checks


def known_answers(profile: Profile, client: Any) -> Stage:
    """The profile's known-answer prompts, greedy, each answer checked by the smoke's own check (the
    share right against the profile's accuracy floor) and its text by the degeneracy detectors."""
    asked = profile.smoke.prompts.known_answers
    kwargs = profile.smoke.chat_template_kwargs
    degenerate: dict[str, list[str]] = {}
    outputs: dict[str, str] = {}
    results: dict[str, str | None] = {}
    for answer in asked:
        done = client.chat(answer.prompt, max_tokens=answer.max_tokens, template_kwargs=kwargs)
        outputs[answer.name] = done.text
        results[answer.name] = answers.check_answer(answer, done.text)
        if findings := coherence.degeneracy(done.text):
            degenerate[answer.name] = findings
    verdict, summary, found = accuracy.judge(profile.smoke.accuracy, results)
    details = {"wrong_answers": found["wrong"], "accuracy": found, "degenerate": degenerate, "outputs": outputs}
    if verdict is Verdict.passed and not degenerate:
        return Stage("known answers", Verdict.passed, f"{summary}, no degeneracy", details)
    first = next(iter(degenerate.values()))[0] if degenerate else summary
    return Stage(
        "known answers",
        Verdict.failed,
        f"{summary}; {len(degenerate)} degenerate output(s) of {len(asked)}; e.g. {first}",
        details,
        hint="the engine serves wrong or degenerate text: read its log, and run `specdeploy smoke` for the full "
        "diagnosis; the light gate changes nothing",
    )


def _since(span: counters.Interval) -> str:
    if span.reset is not None:
        return "since the engine restarted"
    if span.since is None:
        return "since the engine started (no earlier light gate)"
    return f"since the previous light gate ({_iso(span.since)})"


def judge_acceptance(profile: Profile, span: counters.Interval, *, over: str | None = None) -> Stage:
    """Acceptance over an interval against the profile's collapse floor (watch.acceptance_length_min,
    else the smoke band's lower edge), once enough drafts were made to tell. `over` names what was
    measured where it is not the interval since the previous light gate."""
    floor, need = profile.watch_acceptance_floor, profile.watch.min_drafts
    since = over or _since(span)
    details = span.to_json() | {"floor": floor, "min_drafts": need}
    mean = span.mean_acceptance_length
    if span.drafts <= 0 or mean is None:
        if span.requests > 0:
            return Stage(
                "acceptance",
                Verdict.failed,
                f"no drafts at all over {span.requests:g} finished request(s) {since}: speculative decoding is not "
                f"active on this server (profile method {profile.engine.speculative.method!r})",
                details,
                hint="check the engine's --speculative-config and its log; the light gate changes nothing",
            )
        return Stage("acceptance", Verdict.skipped, f"no request finished {since}: nothing to judge", details)
    if span.drafts < need:
        return Stage(
            "acceptance",
            Verdict.skipped,
            f"mean acceptance length {mean:.2f} over only {span.drafts:g} drafts {since} "
            f"(< watch.min_drafts {need}): too little traffic to judge",
            details,
        )
    rates = span.per_position_rates
    first = f"; position 0 accepted {rates[0]:.0%}" if rates else ""
    if mean < floor:
        return Stage(
            "acceptance",
            Verdict.failed,
            f"mean acceptance length {mean:.2f} over {span.drafts:g} drafts {since}, below the floor {floor:g}: "
            f"acceptance collapsed{first}",
            details,
            hint="a collapse with position 0 low means the drafter proposes wrong tokens from the start: was the "
            "drafter, its config or the engine changed since the deploy? `specdeploy verify-config` on the serving "
            "directory and `specdeploy smoke` give the diagnosis; the light gate changes nothing",
        )
    return Stage(
        "acceptance",
        Verdict.passed,
        f"mean acceptance length {mean:.2f} over {span.drafts:g} drafts {since} (floor {floor:g}){first}",
        details,
    )


def _acceptance_vllm(result: WatchResult, profile: Profile, host: layout.HostLayout, now: float) -> Stage:
    where = f"GET {result.endpoint}/metrics"
    current = counters.read(metrics.scrape(str(result.endpoint)), taken_at=now, where=where)
    try:
        previous = counters.load(host.watch_counters)
    except InputFileError as exc:  # our own file, damaged: start again from the engine's counts
        previous = None
        result.snapshot_problem = f"{exc.message}; measured since the engine started instead"
    span = counters.interval(previous, current)
    counters.save(host.watch_counters, current)
    _give_back(host.watch, path=host.watch_counters)
    result.counters = current.to_json()
    result.interval = span.to_json()
    stage = judge_acceptance(profile, span)
    if span.reset:
        stage.details["counter_reset"] = span.reset
    return stage


def _acceptance_sglang(profile: Profile, client: Any) -> Stage:
    """SGLang exports no speculative counters (issue 22): one wave of the profile's acceptance
    prompts, measured per request (completion tokens / verify steps), as the smoke does."""
    prompts = profile.smoke.prompts.acceptance
    batch = [prompts[i % len(prompts)] for i in range(profile.smoke.wave_size)]
    wave = client.acceptance_wave(batch, max_tokens=profile.smoke.acceptance_max_tokens)
    sample = wave.sample
    span = counters.Interval(
        since=None,
        reset=None,
        drafts=sample.drafts,
        draft_tokens=sample.draft_tokens,
        accepted=sample.accepted,
        requests=float(sample.requests),
        per_position=tuple(sample.accepted_per_pos),
    )
    over = f"over the light gate's own {len(batch)} requests (SGLang exports no counters)"
    return judge_acceptance(profile, span, over=over)


def _guarded(name: str, check: Callable[[], Stage]) -> Stage:
    """A check whose engine answered, but not as its API does, is `error` (could not test)."""
    try:
        return check()
    except EngineResponseError as exc:
        return Stage(name, Verdict.error, f"could not test: {exc.message}", hint=exc.hint)


def _judge(result: WatchResult, host: layout.HostLayout, options: WatchOptions) -> None:
    profile_file = options.profile_file or profile_file_of_unit(options.unit_files)
    result.profile_file = str(profile_file)
    profile = load_profile(profile_file)
    result.profile = profile.name
    result.watch = _watch_settings(profile)
    result.endpoint = (options.endpoint or f"http://127.0.0.1:{profile.engine.serve.port}").rstrip("/")
    result.engine_unit = unit_state(options.unit, options.systemctl)
    try:
        record = keeper.load_run(host.rollback)
    except keeper.RunRecordError:
        record = None  # the deploy's record is the deploy's to fix; the served stack can still be judged
    if record is not None and record.open:
        result.verdict = Verdict.skipped
        result.message = (
            f"a deploy (run {record.run_id}) has replaced parts of the stack and its gate has not ended: the light "
            "gate judges only a gated stack. If no deploy is running, that run was interrupted: the next deploy "
            "restores it first (`specdeploy rollback recover`)"
        )
        return
    api_key = options.api_key if options.api_key is not None else secret.read(profile, host)
    run = smoke.Smoke(
        profile,
        result.endpoint,
        smoke.SmokeOptions(
            api_key=api_key,
            show_progress=False,
            readiness_timeout_s=options.readiness_timeout_s or profile.watch.readiness_timeout_s,
            engine_down=startup_log.unit_down(options.unit) if options.systemctl else None,
            # the method vLLM serves with is only in its startup log (k is in its counters)
            startup_log=startup_log.reader(options.unit, options.startup_log)
            if profile.engine.kind == "vllm" and (options.systemctl or options.startup_log is not None)
            else None,
        ),
    )
    try:
        try:
            result.checks.append(_guarded("readiness", lambda: readiness.check(run)))
            if result.checks[-1].status is not Verdict.passed:
                return
            result.checks.append(_guarded("identity", lambda: identity.check(run)))
            if result.checks[-1].status is Verdict.passed:
                result.checks.append(_guarded("known answers", lambda: known_answers(profile, run.client)))
            if profile.engine.kind == "vllm":
                now = options.clock()
                result.checks.append(_guarded("acceptance", lambda: _acceptance_vllm(result, profile, host, now)))
            elif result.checks[-1].status is Verdict.passed:
                result.checks.append(_guarded("acceptance", lambda: _acceptance_sglang(profile, run.client)))
        except EngineUnavailable as exc:
            result.checks.append(
                Stage(
                    "server",
                    Verdict.error,
                    f"the server stopped answering: {exc.message}",
                    hint=f"read the engine log (journalctl -u {options.unit})",
                )
            )
    finally:
        run.close()


def _conclude(result: WatchResult) -> None:
    statuses = [c.status for c in result.checks]
    failed = [c for c in result.checks if c.status is Verdict.failed]
    errors = [c for c in result.checks if c.status is Verdict.error]
    if failed:
        result.verdict = Verdict.failed
        result.message = "; ".join(f"{c.name}: {c.summary}" for c in failed)
    elif errors:
        result.verdict = Verdict.error
        result.message = "could not test: " + "; ".join(f"{c.name}: {c.summary}" for c in errors)
    elif statuses:
        result.verdict = Verdict.passed
        result.message = f"{result.profile} serves as deployed: " + "; ".join(
            f"{c.name} {c.status.value}" for c in result.checks
        )
    reset = (result.interval or {}).get("counter_reset")
    if reset:
        result.message += f" (note: {reset})"


def _write(host: layout.HostLayout, result: WatchResult) -> None:
    atomic.write_json(host.watch_result, result.to_json(), mode=0o640)
    _give_back(host.watch, path=host.watch_result)


def run_watch(host: layout.HostLayout, options: WatchOptions | None = None) -> WatchResult:
    """One light gate: judge, write the result and the textfile, call the hook on a failure.
    The result file is on disk however this ends (a bug and SIGTERM included)."""
    options = options or WatchOptions()
    _claim(host)
    with _lock(host.watch_lock):
        result = WatchResult(state=str(host.state), started_unix=options.clock())
        result.config = options.config.to_json()
        _write(host, result)
        try:
            with sigterm_interrupts():
                _judge(result, host, options)
                if result.verdict is Verdict.running:
                    _conclude(result)
        except (Interrupted, KeyboardInterrupt) as exc:
            result.verdict = Verdict.interrupted
            result.message = f"interrupted ({exc or 'SIGINT'}) before a verdict; the hook was not called"
        except SpecdeployError as exc:  # no profile, a bad one, an unreadable key: could not test (exit 2)
            result.verdict = Verdict.error
            result.message, result.hint = f"could not test: {exc.message}", exc.hint
        except BaseException as exc:  # a bug: recorded, then the CLI's boundary reports it (exit 70)
            result.verdict, result.error_exit = Verdict.error, 70
            result.message = f"the light gate itself failed ({type(exc).__name__}: {exc})"
            result.finished_unix = options.clock()
            _write(host, result)
            raise
        result.finished_unix = options.clock()
        _write(host, result)
        _export(result, options)
        if options.run_hook and options.config.hook and result.verdict in HOOKED:
            outcome = hook.call(
                options.config.hook, host.watch_result, result.verdict.value, timeout_s=options.config.hook_timeout_s
            )
            result.hook = outcome.to_json()
        _write(host, result)
    return result


def _export(result: WatchResult, options: WatchOptions) -> None:
    """The textfile (a failure to write it is recorded, never the verdict's)."""
    path = options.config.textfile
    if path is None:
        result.textfile = {"path": None, "written": False, "error": "no textfile (the host's settings say none)"}
        return
    try:
        textfile.write(path, result.to_json())
    except (WriteError, OSError) as exc:
        detail = exc.message if isinstance(exc, SpecdeployError) else str(exc)
        result.textfile = {"path": str(path), "written": False, "error": detail}
        return
    result.textfile = {"path": str(path), "written": True, "error": None}


# --------------------------------------------------------------------------- reading it back


RESULT = "light gate result"


def load_result(host: layout.HostLayout) -> dict[str, Any]:
    """The last light gate's result on this host (an InputFileError naming the file otherwise)."""
    path = host.watch_result
    if not path.exists() and not path.is_symlink():
        raise InputFileError(
            f"{RESULT} {path}: no light gate has run with this state directory",
            hint="run `specdeploy watch run` (the timer runs it every watch.interval_s), or pass --state-dir",
        )
    hint = "run `specdeploy watch run` again: it replaces the file"
    try:
        record = files.expect_mapping(files.read_json(path, what=RESULT), str(path), what=RESULT)
    except InputFileError as exc:
        raise InputFileError(exc.message, hint=hint) from None
    for key in ("verdict", "checks", "message"):
        if key not in record:
            raise InputFileError(
                f"{RESULT} {path}: field {key}: expected it in the light gate's result, found no such field",
                hint=hint,
            )
    return record


__all__ = ["Verdict", "WatchOptions", "WatchResult", "load_result", "run_watch", "unit_state"]
