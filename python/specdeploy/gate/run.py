"""The deploy's gate: `specdeploy gate` decides whether a freshly deployed stack may serve.

One command, one report, one exit code: the served drafter config (the serving directory's
config.json verified again, as the engine reads it), the startup-log check (a DFlash drafter must be
wired to the layers the profile says), the smoke checks, and — when either fails — the
rollback, which restores what this run replaced and proves the previous stack serves. The
Ansible role is a thin call to it; nothing in YAML parses an outcome.

Every run writes `<state>/runs/<run-id>/gate.json` (core.layout) from its first second
("running") to its last, on every exit path: a pass, a failure, an unreachable endpoint, a
SIGTERM or Ctrl-C ("interrupted"). A run never writes another run's file, so no report is
left stale from an earlier run. The run's directory also holds the profile and lock it ran
with; when the gate passes, `<state>/verified` is switched (one symlink flip) to that
directory — the last stack proven to serve, which later stages (golden transcripts,
migrations) read. A run that does not pass never touches it.

Inputs are checked before anything is judged (issue 20): a run id that is not a plain name or a
state directory that cannot hold the run's report is a usage error (exit 2) that changes
nothing; a --startup-log that is not a regular, bounded file is refused at once (it was read
only when the DFlash check ran, and a FIFO blocked it forever); an endpoint that is not a base
URL ends the smoke's readiness at once, saying why. An answer that is not the engine's API is
the smoke's "could not test" (exit 2) and rolls back like any other, never a crash (exit 70)
that skipped the rollback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files, keeper, layout, progress
from specdeploy.core.errors import EXIT_INTERNAL, SpecdeployError, UsageError, WriteError
from specdeploy.core.verdicts import EXIT_CODES, Interrupted, Stage, Verdict, sigterm_interrupts
from specdeploy.drafter import verify
from specdeploy.engine import secret, startup_log
from specdeploy.gate import golden
from specdeploy.images import prune as image_prune
from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rollback import restore
from specdeploy.smoke import run as smoke
from specdeploy.smoke.clients import EngineUnavailable, endpoint_problem
from specdeploy.weights import store

KEEP_RUNS = 20  # run directories kept besides the verified one


# The gate's exit codes (docs/commands.md "Exit codes"): the one vocabulary's (core.verdicts), plus 4 when the
# new stack failed and the host was not proven to serve the previous one.
EXIT_NOT_RESTORED = 4


@dataclass(frozen=True)
class GateOptions:
    endpoint: str | None = None  # default: http://127.0.0.1:<the profile's port>
    unit: str = layout.UNIT_NAME  # whose journal holds the startup log (DFlash)
    log_file: Path | None = None  # a saved engine log instead of the journal
    rollback: bool = True
    api_key: str | None = None
    show_progress: bool = False
    readiness_timeout_s: float | None = None  # default: the profile's smoke.readiness_timeout_s
    podman: str = "podman"  # prunes the engine's old images after a pass (container profiles)
    unit_file: Path = layout.UNIT_FILES["container"]  # the quadlet whose Image= the engine runs
    # a deploy's re-run: when it replaced nothing and the engine run is the one the last verified gate
    # judged, check readiness and the served identity only (`_unchanged_since`); off for a gate asked
    # for by hand or by `migrate verify`, which judges the stack in full
    light_if_unchanged: bool = False


@dataclass
class GateReport:
    run_id: str
    profile: str
    profile_file: str
    endpoint: str
    directory: Path
    started_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    started: float = field(default_factory=time.monotonic)
    verdict: Verdict = Verdict.running
    message: str = "the gate is running"
    # how the engine's unit was found before anything was asked (startup_log.wait_settled): "settled",
    # or still changing at the deadline; None when the gate was not run against the host's own unit
    unit_settled: str | None = None
    # the serving directory's drafter config.json, verified again as the engine serves it (gate step 2)
    served_config: dict[str, Any] | None = None
    startup_log: dict[str, Any] | None = None
    smoke: dict[str, Any] | None = None
    rollback: dict[str, Any] | None = None
    verified: bool = False
    # what the serving links resolved to when the stack passed (weights.store.prune keeps these)
    served: list[str] | None = None
    pruned: list[str] | None = None
    # the engine images removed after the pass (container profiles; images.prune), then what was not
    images_pruned: list[str] | None = None
    # the served identity's key, and whether this run compared with its golden or recorded one (gate.golden)
    golden: dict[str, Any] | None = None
    # systemd's ID of the engine unit's run this gate judged (None off a host's unit): a later run that
    # changed nothing finds the same one and is not judged again in full
    engine_invocation: str | None = None
    # the passing run whose stack this run found unchanged (nothing replaced, the same engine run), if any
    unchanged_since: str | None = None
    finished_at: str | None = None
    rolling_back: bool = False
    # Set when the gate could not run at all: the CLI's exit code for that error (a bad
    # profile: 2; a bug in specdeploy: 70), so the report and the process agree.
    error_exit: int | None = None

    @property
    def exit_code(self) -> int:
        if self.error_exit is not None:
            return self.error_exit
        if self.verdict is not Verdict.passed and self.rollback is not None and self.rollback_left_no_stack:
            return EXIT_NOT_RESTORED
        return EXIT_CODES[self.verdict]

    @property
    def rollback_left_no_stack(self) -> bool:
        """The rollback failed, or restarted a previous stack that was not proven to serve."""
        outcome = self.rollback or {}
        return bool(outcome.get("error")) or (
            outcome.get("unit_action") == "restarted" and not outcome.get("previous_stack_serves")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "profile": self.profile,
            "profile_file": self.profile_file,
            "endpoint": self.endpoint,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "message": self.message,
            "unit_settled": self.unit_settled,
            "served_config": self.served_config,
            "startup_log": self.startup_log,
            "smoke": self.smoke,
            "rollback": self.rollback,
            "verified": self.verified,
            "served": self.served,
            "pruned": self.pruned,
            "images_pruned": self.images_pruned,
            "golden": self.golden,
            "engine_invocation": self.engine_invocation,
            "unchanged_since": self.unchanged_since,
        }

    @property
    def path(self) -> Path:
        """This report's file in the run's directory (core.layout's GATE_REPORT)."""
        return self.directory / layout.GATE_REPORT

    def write(self) -> None:
        atomic.write_json(self.path, self.to_json(), mode=REPORT_MODE)


REPORT_MODE = 0o640  # root reads and writes, its group reads; others nothing (the state directory is 0750 too)


def _claim(host: layout.HostLayout, run_id: str) -> Path:
    """The run's own directory; a run is gated once, so an existing report is never overwritten."""
    keeper.check_run_id(run_id)
    if host.state.exists() and not host.state.is_dir():
        raise UsageError(
            f"--state-dir {host.state}: expected a directory, found a file; the run's report cannot be kept there",
            hint="pass the host's state directory (`specdeploy facts` shows it as paths.state)",
        )
    directory, report = host.run_dir(run_id), host.gate_report(run_id)
    if report.exists() or report.is_symlink():
        raise SpecdeployError(
            f"run {run_id} already has a gate report ({report})",
            hint="each deploy run is gated once; start a new run (a new --run-id)",
        )
    try:
        atomic.ensure_dir(directory)
    except WriteError as exc:
        raise UsageError(
            f"--state-dir {host.state}: the run's directory {directory} cannot be made ({exc.message}); "
            "nothing was gated",
            hint="pass a state directory this user can write to (root on a host)",
        ) from None
    return directory


def _keep_inputs(report: GateReport, profile_file: Path, profile: Profile, host: layout.HostLayout) -> None:
    """What this run is gated with, kept beside its report (and so in verified/ when it passes)."""
    atomic.write_bytes(
        report.directory / f"{profile.name}.yaml",
        files.read_bytes(profile_file, what="profile", limit=files.LIMITS["yaml"]),
    )
    if host.lock.is_file():
        atomic.write_bytes(report.directory / host.lock.name, files.read_bytes(host.lock, what="lock file"))


def _read_startup_log(path: Path) -> str:
    """A saved engine log: a regular file within the text ceiling (a FIFO or a device is refused at
    once); bytes that are not UTF-8 are replaced, as a journal would show them."""
    data = files.read_bytes(
        path, what="startup log", limit=files.LIMITS["text"], hint="pass --startup-log a saved engine log file"
    )
    return data.decode("utf-8", errors="replace")


def _check_startup_log(profile: Profile, options: GateOptions, endpoint: str, log_text: str | None) -> dict[str, Any]:
    if profile.engine.speculative.method != "dflash":
        method = profile.engine.speculative.method
        return {"ok": True, "skipped": True, "message": f"{method}: no auxiliary-layer line to check"}
    if log_text is not None:
        check = startup_log.check_aux_layers(profile, log_text)
    else:
        check = startup_log.check_unit(
            profile,
            options.unit,
            timeout_s=options.readiness_timeout_s or profile.smoke.readiness_timeout_s,
            ready=startup_log.health_answers(endpoint),
        )
    return {
        "ok": check.ok,
        "skipped": False,
        "expected": check.expected,
        "found": check.found,
        "message": check.message,
        "runner": check.runner,
    }


def _check_served_config(profile: Profile, host: layout.HostLayout) -> dict[str, Any]:
    """The drafter's config.json as the engine serves it (the serving directory), verified again against
    the profile and the canonical sha256 the lock recorded when write-config verified it.

    Failure prevented: the field's corrected config.json silently failed to land, and a field changed by
    hand after write-config wrote the file is served until someone reads the logs; the drafter_config
    stage checks the file before the engine starts, this checks what the started engine reads."""
    if profile.drafter is None or profile.drafter.config is None:
        return {"ok": True, "skipped": True, "message": "no drafter config to check (the profile pins none)"}
    path = host.drafter_serving / verify.CONFIG_NAME
    if not path.exists():
        return {"ok": True, "skipped": True, "message": f"no {path} (the engine is not served from this layout)"}
    try:
        checked = verify.verify(path, profile, lock=Lock(host.lock) if host.lock.is_file() else None)
    except SpecdeployError as exc:
        return {"ok": False, "skipped": False, "path": str(path), "message": f"{path}: {exc.message}"}
    failures = [
        {"field": c.field, "expected": c.expected, "found": c.found, "consequence": c.consequence}
        for c in checked.failures
    ]
    if not failures:
        message = f"{path} verifies (canonical sha256 {checked.canonical_sha256[:12]}, as write-config recorded it)"
        return {"ok": True, "skipped": False, "path": str(path), "message": message}
    first = failures[0]
    message = (
        f"{path}, as the engine serves it, does not verify: {', '.join(f['field'] for f in failures)}; "
        f"first: {first['field']} expected {first['expected']}, found {first['found']} ({first['consequence']}) — "
        "a file changed after write-config verified it: re-run the deploy's drafter_config stage, never edit it"
    )
    return {"ok": False, "skipped": False, "path": str(path), "message": message, "failures": failures}


def _mark_verified(report: GateReport, host: layout.HostLayout) -> None:
    """Close this run's rollback record ("verified": its copies are obsolete), then point
    `<state>/verified` at this run's directory (one atomic symlink flip) and record the pass, with
    SIGTERM and SIGINT held back meanwhile: the link, the record and the report always agree. The
    record is closed first: a damaged one (keeper.RunRecordError, exit 2) leaves `verified` as it
    was, and a flip that fails opens the record again."""
    held = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        report.served = store.served_now(host)
        try:
            closed = keeper.close_run(host.rollback, report.run_id, "verified")
        except keeper.RunRecordError as exc:
            raise keeper.RunRecordError(
                f"the stack passed its smoke, but the {exc.message}; {host.verified} was not switched to this run",
                hint=exc.hint,
            ) from None
        try:
            atomic.symlink(host.verified, report.directory.relative_to(host.state))
        except BaseException:
            if closed:  # the run is not verified after all: its copies are the way back again
                with contextlib.suppress(OSError, SpecdeployError):
                    keeper.close_run(host.rollback, report.run_id, None)
            raise
        report.verified = True
        report.verdict = Verdict.passed
        report.message = f"{report.profile} passed its gate: {host.verified} now points at this run"
        report.write()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _prune(host: layout.HostLayout, keep: int = KEEP_RUNS) -> None:
    """Drop the oldest run directories beyond `keep`, never the verified one."""
    verified = host.verified.resolve() if host.verified.is_symlink() else None
    runs = sorted((d for d in host.runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for old in runs[keep:]:
        if old.resolve() != verified:
            shutil.rmtree(old, ignore_errors=True)


class _KeptStep(progress.Step):
    """The gate's progress step: its lines to stderr (the unit's journal), and its newest state, at each
    observation and each tick, in `<run dir>/gate.progress`, where `gate-wait` reads it. Built and
    written under one lock: the ticker, the gate and the smoke's worker threads all observe."""

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, write=self._line)
        self._path = path
        self._keeping = threading.Lock()

    def _line(self, text: str) -> None:
        progress.plain(text)
        self._keep()

    def _keep(self) -> None:
        with self._keeping:  # the newest state, never an older one written over it
            text = progress.line(self.name, self.elapsed, self.last)
            # a line not kept is a staler `gate-wait`, never a failed gate
            with contextlib.suppress(OSError, SpecdeployError):
                atomic.write_bytes(self._path, f"{text}\n".encode(), REPORT_MODE)

    def observe(self, text: str) -> None:
        super().observe(text)
        self._keep()


def _progress(host: layout.HostLayout, run_id: str, options: GateOptions) -> contextlib.AbstractContextManager[Any]:
    """Where no terminal shows the smoke's bars (the gate as a unit, a deploy's), a progress step
    (core.progress): a line at least every 20 s to stderr (the unit's journal) naming the check that runs
    and how far it is, its newest state also kept in `<run dir>/gate.progress` for `gate-wait` to show."""
    if options.show_progress:
        return contextlib.nullcontext()
    step = _KeptStep("gate", host.gate_progress(run_id))
    step.observe("started")
    return step


def run_gate(
    profile_file: Path,
    host: layout.HostLayout,
    run_id: str,
    options: GateOptions = GateOptions(),
    *,
    prove: Callable[[layout.HostLayout, str], restore.Outcome] | None = None,
) -> GateReport:
    """Gate the stack deployed by run `run_id`; the report is on disk however this ends."""
    profile_file = Path(profile_file)
    report = GateReport(run_id, profile_file.stem, str(profile_file), options.endpoint or "", _claim(host, run_id))
    report.write()
    try:
        with sigterm_interrupts(), _progress(host, run_id, options):
            log_text = _read_startup_log(options.log_file) if options.log_file is not None else None
            profile = load_profile(profile_file)
            report.profile = profile.name
            report.endpoint = options.endpoint or f"http://127.0.0.1:{profile.engine.serve.port}"
            _keep_inputs(report, profile_file, profile, host)
            report.write()
            if options.api_key is None:  # the host's key file (engine.secret), as the engine reads it
                options = dataclasses.replace(options, api_key=secret.read(profile, host))
            _gate(report, profile, host, options, prove or _restore_and_prove(options.unit), log_text)
    except (Interrupted, KeyboardInterrupt) as exc:
        signal_name = str(exc) or "SIGINT"
        if report.rolling_back:
            report.verdict = Verdict.interrupted
            report.message = (
                f"interrupted ({signal_name}) during the rollback: the host may be half restored; "
                f"run `specdeploy rollback restore --run-id {run_id}` to finish putting the previous stack back"
            )
        elif report.verdict is not Verdict.running:
            report.message += f" ({signal_name} arrived after the verdict)"
        else:
            report.verdict = Verdict.interrupted
            report.message = (
                f"interrupted ({signal_name}) before a verdict: nothing was rolled back; "
                f"re-run the gate, or `specdeploy rollback restore --run-id {run_id}` to go back"
            )
    except SpecdeployError as exc:  # the gate could not start (e.g. an invalid profile)
        report.verdict, report.error_exit = Verdict.error, exc.exit_code
        report.message = f"could not gate: {exc.message}"
        raise
    except Exception as exc:  # a bug: recorded here, reported by the CLI's error boundary
        report.verdict, report.error_exit = Verdict.error, EXIT_INTERNAL
        report.message = f"the gate itself failed ({type(exc).__name__}: {exc}); nothing was rolled back"
        raise
    finally:
        report.finished_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        report.write()
    _prune(host)
    return report


def _prune_images(image_name: str, host: layout.HostLayout, options: GateOptions) -> list[str]:
    """The engine images no unit (current or kept for the rollback) names, removed; any failure is
    a line of the report (images.prune reports its own), never the gate's."""
    try:
        pruned = image_prune.prune(
            image_name, unit_file=options.unit_file, rollback=host.rollback, podman=options.podman
        )
    except Exception as exc:  # a pass stays a pass
        return [f"not pruned: no image of {image_name} was removed: {type(exc).__name__}: {exc}"]
    return pruned.lines()


def _restore_and_prove(unit: str) -> Callable[[layout.HostLayout, str], restore.Outcome]:
    return lambda host, run_id: restore.restore_and_prove(host, run_id, unit=unit)


def _unchanged_since(report: GateReport, profile_file: Path, host: layout.HostLayout, unit: str) -> str | None:
    """The passing run whose stack this run left exactly as it was, or None.

    A re-run that changed nothing (a no-op deploy: nothing replaced, the engine not restarted) need not
    judge the same engine run again in full: its verified run did, and the light gate keeps judging it.
    Exactly as it was means: this run replaced nothing (its rollback record is empty), `<state>/verified`
    names a passing run gated with the same profile and lock, and the engine unit's run (systemd's
    InvocationID) is the one that run judged. Anything else, or anything unreadable, is a full gate."""
    try:
        record = keeper.load_run(host.rollback)
        if record is not None and record.run_id == report.run_id and record.entries:
            return None
        if not host.verified.is_symlink():
            return None
        last = files.expect_mapping(
            files.read_json(host.verified_gate_report, what="gate report"), "verified", what="report"
        )
        if last.get("verdict") != Verdict.passed.value or not last.get("engine_invocation"):
            return None
        same_profile = (host.verified / profile_file.name).read_bytes() == profile_file.read_bytes()
        kept_lock = host.verified / host.lock.name
        same_lock = (kept_lock.read_bytes() if kept_lock.is_file() else None) == (
            host.lock.read_bytes() if host.lock.is_file() else None
        )
        if not (same_profile and same_lock) or startup_log.invocation(unit) != last["engine_invocation"]:
            return None
        return str(last.get("run_id"))
    except (SpecdeployError, OSError):
        return None


def _gate_unchanged(report: GateReport, profile: Profile, options: GateOptions, since: str) -> None:
    """Readiness and the served identity only, for a run that changed nothing since `since` passed."""
    from specdeploy.smoke.checks import identity, readiness

    run = smoke.Smoke(
        profile,
        report.endpoint,
        smoke.SmokeOptions(
            api_key=options.api_key,
            show_progress=options.show_progress,
            readiness_timeout_s=options.readiness_timeout_s,
            startup_log=startup_log.reader(options.unit) if profile.engine.kind == "vllm" else None,
        ),
    )
    try:
        for check in (readiness.check, identity.check):
            stage = check(run)
            run.report.stages.append(stage)
            if stage.status is not Verdict.passed:
                break
    except EngineUnavailable as exc:
        run.report.stages.append(Stage("server", Verdict.error, f"the server stopped answering: {exc.message}"))
    finally:
        run.close()
    run.report.elapsed_s = time.monotonic() - run.report.started
    report.smoke = run.report.to_json()
    report.unchanged_since = since
    report.verdict = Verdict(run.report.verdict.value)
    if report.verdict is Verdict.passed:
        report.message = (
            f"nothing changed since run {since}, which passed its full gate: this run replaced nothing and the "
            f"engine has not restarted since; readiness and the served identity checked again (the light gate's "
            f"timer keeps judging it); verified/ stays on run {since}"
        )
    else:
        last = report.smoke["stages"][-1]["summary"]
        report.message = f"the stack run {since} verified, unchanged since, no longer passes: {last}"


def _gate(
    report: GateReport,
    profile: Profile,
    host: layout.HostLayout,
    options: GateOptions,
    prove: Callable[[layout.HostLayout, str], restore.Outcome],
    log_text: str | None = None,
) -> None:
    if options.log_file is None:  # the host's own unit: never judge the run a queued restart is replacing
        progress.observe(f"waiting for {options.unit} to settle (no restart queued)")
        report.unit_settled = (
            startup_log.wait_settled(options.unit, options.readiness_timeout_s or profile.smoke.readiness_timeout_s)
            or "settled"
        )
        report.engine_invocation = startup_log.invocation(options.unit)
        since = _unchanged_since(report, Path(report.profile_file), host, options.unit)
        if since is not None and options.light_if_unchanged:
            _gate_unchanged(report, profile, options, since)
            report.write()
            return
    progress.observe("checking the served drafter config and the startup log")
    report.served_config = _check_served_config(profile, host)
    if problem := endpoint_problem(report.endpoint):  # the smoke's readiness says why, at once
        report.startup_log = {"ok": True, "skipped": True, "message": f"not checked: the endpoint {problem}"}
    else:
        report.startup_log = _check_startup_log(profile, options, report.endpoint, log_text)
    report.write()
    identity = golden.served_identity(profile, host, unit_file=options.unit_file, podman=options.podman)
    identity_key = golden.key(identity)
    known = golden.path(host, identity_key)
    recorded = report.directory / golden.RECORDED
    report.golden = {"key": identity_key, "identity": identity}
    if report.startup_log["ok"] and report.served_config["ok"]:
        smoke_options = smoke.SmokeOptions(
            api_key=options.api_key,
            show_progress=options.show_progress,
            readiness_timeout_s=options.readiness_timeout_s,
            engine_down=startup_log.unit_down(options.unit) if options.log_file is None else None,
            startup_log=startup_log.reader(options.unit, log_text) if profile.engine.kind == "vllm" else None,
            golden=known if known.is_file() else None,
            record_golden=None if known.is_file() else recorded,
        )
        report.golden["compared_with" if known.is_file() else "recorded_to"] = str(
            known if known.is_file() else recorded
        )
        result = smoke.run(profile, report.endpoint, smoke_options)
        report.smoke = result.to_json()
        verdict = Verdict(result.verdict.value)
    else:
        verdict = Verdict.failed
    if verdict is Verdict.passed:  # a pass is recorded together with the verified/ flip
        _mark_verified(report, host)
        if not known.is_file() and recorded.is_file():  # a new identity: its golden, the old ones kept
            try:
                report.golden["adopted"] = str(golden.adopt(host, identity_key, identity, recorded))
            except (SpecdeployError, OSError) as exc:
                report.golden["adopted"] = None
                report.golden["problem"] = exc.message if isinstance(exc, SpecdeployError) else str(exc)
        # only now may old revisions go: this run's and the last passing ones' stay; a failure to
        # prune is reported, and never turns the pass into a failure (or a rollback)
        try:
            report.pruned = store.prune(host, profile.weights.keep_revisions)
        except (SpecdeployError, OSError) as exc:
            report.pruned = [f"not pruned: {exc.message if isinstance(exc, SpecdeployError) else exc}"]
        if profile.engine.runtime == "container" and profile.engine.image is not None:
            report.images_pruned = _prune_images(profile.engine.image.name, host, options)
        report.write()
        return
    report.verdict = verdict
    report.write()
    if report.smoke is not None:
        what = f"smoke verdict {report.verdict.value}"
    elif not report.served_config["ok"]:
        what = f"served config: {report.served_config['message']}"
    else:
        what = f"startup log: {report.startup_log['message']}"
    if not options.rollback:
        report.message = f"{what}; rollback disabled (--no-rollback): the failing stack stays in place"
        return
    report.rolling_back = True
    report.write()
    progress.observe(f"{what}: restoring the previous stack and proving it serves")
    try:
        outcome = prove(host, report.run_id)
    except Exception as exc:  # any failure to restore leaves the host without a proven stack: exit 4
        detail = exc.message if isinstance(exc, SpecdeployError) else f"{type(exc).__name__}: {exc}"
        report.rollback = {"error": detail, "previous_stack_serves": False}
        report.message = f"{what}; the rollback failed: {detail}"
        report.rolling_back = False
        return
    report.rolling_back = False
    report.rollback = outcome.to_json()
    report.message = f"{what}; rollback: {outcome.message}"
