"""`specdeploy tune --sweep`: measure real throughput at each draft length, each one a gated deploy.

Failure prevented: k changed by hand on a running engine (an ungated restart), or a sweep that leaves
a host on a k nobody proved. Here each k is the site override `tune.write_override` writes, deployed
with the site's own play (`ansible-playbook deploy.yml -l HOST`, the smoke gate and its rollback
included); a k whose gate fails is rolled back by the play to the stack before it, recorded as
failed, and never measured. Each k that passes is measured on the engine host itself (`specdeploy
bench run` over SSH, against the engine's loopback, `repeats` times); the sweep's report holds every
measured run, and the tuner fits its model to them.

Before the first k the deployed stack is measured as it is: its per-position acceptance gives each k's
acceptance bands (tune.overrides_for). The host is left on the last k that passed its gate; the
override file in the sweep's folder says which.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.bench import compare, tune
from specdeploy.bench import report as reports
from specdeploy.bench.report import Report, Run
from specdeploy.bench.run import PROGRESS_S, BenchError, tail
from specdeploy.core import atomic, files, layout
from specdeploy.core.errors import UsageError
from specdeploy.core.keeper import new_run_id
from specdeploy.core.programs import ansible_program
from specdeploy.migrate import hosts
from specdeploy.profile import Profile

DEPLOY_TIMEOUT_S = 3600.0
BENCH_TIMEOUT_S = 3600.0


@dataclass
class Step:
    """One k of the sweep."""

    k: int
    run_id: str
    deployed: bool
    gate: dict[str, Any] | None = None  # verdict, message, rollback of the deploy's gate report
    runs: list[Run] = field(default_factory=list)
    log: str = ""
    reason: str = ""  # why this k was measured (asked for, or where the search pointed)

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "run_id": self.run_id,
            "deployed": self.deployed,
            "gate": self.gate,
            "runs": [r.label for r in self.runs],
            "log": self.log,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Plan:
    """What the sweep deploys and where."""

    profile: Profile  # the host's profile (the override extends it)
    ks: list[int] | None  # in this order; None: where the tuner's search points (`--sweep auto`, tune.next_k)
    inventory: Path
    host: str
    playbook: Path
    overrides: Path  # the folder the host's specdeploy_profiles_src names; <profile>.yaml is written there
    workdir: Path
    extra_vars: list[str] = field(default_factory=list)  # -e K=V for each play
    vault_password_file: Path | None = None
    repeats: int = 1
    bench_args: list[str] = field(default_factory=list)  # host paths for `bench run`, e.g. --models-dir
    workload: Path | None = None
    max_k: int | None = None  # the largest k considered (default: the deployed profile's)
    deploy_pick: bool = True  # end on the recommended k (a gated deploy) when it is not what the host serves
    concurrency: int | None = None  # the level whose pick is deployed (default: the highest measured)
    baseline: Report | None = None  # runs measured before (`--from-report`: e.g. the stack without speculation)


class Sweep:
    """One sweep over one host: its connection (the inventory's settings), its deploys and benches."""

    def __init__(self, plan: Plan, say: Any) -> None:
        self.plan = plan
        self.say = say
        self.access = hosts.access(plan.inventory, plan.host, vault_password_file=plan.vault_password_file)
        named = self.access.variables.get("specdeploy_profile")
        if named and named != plan.profile.name:
            raise UsageError(
                f"--profile {plan.profile.name}: the inventory deploys {named!r} to {plan.host}: the sweep would "
                "switch the host to another profile",
                hint=f"pass --profile {named}",
            )
        self.connection = hosts.connect(self.access)
        self.cli = layout.InstallLayout().to_json()["cli"]
        state = self.access.variables.get("specdeploy_state_dir")
        self.host_layout = layout.HostLayout.of(state=str(state) if state else None)

    # ----------------------------------------------------------------- the host
    def _remote(self, command: str, timeout: float) -> Any:
        return self.connection.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)

    def bench(self, label: str) -> Report:
        """`specdeploy bench run` on the engine host, against its loopback; its report."""
        plan = self.plan
        out = f"/tmp/specdeploy-bench-{os.getpid()}-{int(time.time())}"
        # no --profile: the host's bench judges with the copy its engine unit names (what serves, also after
        # a rollback put the previous unit back)
        argv = [self.cli, "bench", "run", "--label", label, "--out", out, "--no-plots", "--json", *plan.bench_args]
        if plan.workload is not None:
            self.connection.put(str(plan.workload), f"{out}.workload.yaml")
            argv += ["--workload", f"{out}.workload.yaml"]
        self.say(f"sweep: bench {label} on {self.access.name}")
        done = self._remote(shlex.join(argv), BENCH_TIMEOUT_S)
        self._remote(f"rm -rf {shlex.quote(out)} {shlex.quote(out)}.workload.yaml", 60)
        if done.exited != 0:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["(nothing)"])[-1]
            raise BenchError(f"bench {label} on {self.access.name} exited {done.exited}: {last[:300]}",
                             hint="run the same `specdeploy bench run` on the host by hand to see why")  # fmt: skip
        try:
            data = files.loads(done.stdout)
            report = Report.model_validate({k: v for k, v in data.items() if k not in ("rows", "files")})
        except Exception as exc:  # noqa: BLE001 - a host's answer is input: any shape is refused the same way
            raise BenchError(f"bench {label} on {self.access.name}: its report is unusable ({exc})"[:400]) from None
        if report.workload_key != report.workload.key:
            raise BenchError(f"bench {label} on {self.access.name}: its report's workload_key is not its workload's")
        return report

    def gate_report(self, run_id: str) -> dict[str, Any] | None:
        path = self.host_layout.gate_report(run_id)
        done = self._remote(f"cat {shlex.quote(str(path))}", 60)
        if done.exited != 0:
            return None
        try:
            data = files.loads(done.stdout)
        except files.JSONTextError:
            return None
        if not isinstance(data, dict):
            return None
        rollback = data.get("rollback") if isinstance(data.get("rollback"), dict) else {}
        return {
            "verdict": data.get("verdict"),
            "message": data.get("message"),
            "report": str(path),
            "previous_stack_serves": rollback.get("previous_stack_serves") if rollback else None,
        }

    # ----------------------------------------------------------------- the deploy
    def deploy(self, k: int) -> Step:
        plan = self.plan
        run_id = new_run_id()
        argv = [str(ansible_program("ansible-playbook", why="the sweep deploys each k with the site's play")),
                plan.playbook.name, "-i", str(plan.inventory), "-l", plan.host]  # fmt: skip
        variables = [*plan.extra_vars, f"specdeploy_profiles_src={plan.overrides}",
                     f"specdeploy_profile={plan.profile.name}", f"specdeploy_run_id={run_id}"]  # fmt: skip
        for var in variables:
            argv += ["-e", var]
        if plan.vault_password_file is not None:
            argv += ["--vault-password-file", str(plan.vault_password_file)]
        log = plan.workdir / f"deploy-k{k}.log"
        what = f"sweep: deploy k={k} to {plan.host} (run {run_id})"
        self.say(f"{what}: ansible-playbook {plan.playbook.name} -l {plan.host}")
        code = _stream(argv, plan.playbook.parent, log, what, self.say)
        if code is None:
            raise BenchError(
                f"{what}: the play did not finish within {DEPLOY_TIMEOUT_S:g} s and was stopped (log: {log}); the "
                "sweep stops here",
                hint="read the log; the next play recovers an interrupted run first (restores and proves the stack)",
            )
        gate = self.gate_report(run_id)
        step = Step(k, run_id, deployed=code == 0, gate=gate, log=str(log))
        if code == 0:
            self.say(f"{what}: passed its gate")
        elif gate is None:
            self.say(f"{what}: the play FAILED before its gate (exit {code}; log {log}); it restored what it replaced")
        else:
            self.say(f"{what}: FAILED its gate ({gate.get('verdict')}); the play restored the stack before it")
        return step

    # ----------------------------------------------------------------- the sweep
    def run(self) -> tuple[Report, list[Step], list[tune.Recommendation]]:
        plan = self.plan
        plan.workdir.mkdir(parents=True, exist_ok=True)
        tune.check_directory(plan.overrides)
        override = plan.overrides / f"{plan.profile.name}.yaml"
        original = override.read_bytes() if override.is_file() else None
        before = self.bench("deployed")  # the stack as it is: its acceptance curve gives each k's bands
        if plan.baseline is not None:
            compare.require_same("the sweep's first bench", before, "--from-report", plan.baseline,
                                 "bench the baseline with the sweep's --workload, or sweep with the report's",
                                 BenchError)  # fmt: skip
        curve = _curve(before)
        # the largest k considered: --max-k, else the deployed profile's or the largest asked for
        max_k = plan.max_k or max([plan.profile.engine.speculative.num_speculative_tokens, *(plan.ks or [])])
        for k in plan.ks if plan.ks is not None else range(1, max_k + 1):
            tune.overrides_for(plan.profile, k, curve)  # every k checked before the first deploy: none refused halfway
        steps: list[Step] = []
        start = reports.make(before.workload, [*(plan.baseline.runs if plan.baseline else []), *before.runs])
        measured = start

        notes: dict[int, str] = {}  # each k's override note: the folder is left as that k's deploy wrote it

        def deploy_and_measure(k: int, why: str) -> list[Run] | None:
            notes[k] = f"specdeploy tune --sweep: k={k} ({why}; run by {os.environ.get('USER', '?')})"
            tune.write_override(plan.overrides, plan.profile, k, curve, notes[k])
            step = self.deploy(k)
            step.reason = why
            steps.append(step)
            if not step.deployed:
                return None
            for i in range(plan.repeats):
                got = self.bench(f"k={k} #{i + 1}")
                compare.require_same("the sweep's first bench", before, f"bench k={k} on {self.access.name}", got,
                                     "the host's bench must read the same workload: pass --workload",
                                     BenchError)  # fmt: skip
                step.runs += got.runs
            return step.runs

        failed: list[int] = []
        picks: list[tune.Recommendation] = []
        try:
            measured, failed = tune.search(start, max_k, deploy_and_measure, plan.ks, self.say)
            try:
                picks = tune.recommend(measured, max_k=max_k, failed=frozenset(failed))
            except tune.TuneError as exc:
                self.say(f"sweep: no recommendation: {exc.message}")
            if plan.deploy_pick and picks:
                self._deploy_pick(picks, steps, notes, curve, deployed_k=before.runs[0].k)
        finally:
            # the folder names what the host serves: the last k that passed, else what was there before
            last = next((s.k for s in reversed(steps) if s.deployed), None)
            if last is not None:
                tune.write_override(plan.overrides, plan.profile, last, curve, notes[last])
            elif original is not None:
                atomic.write_bytes(override, original)
            else:
                override.unlink(missing_ok=True)
            runs = [*start.runs, *(run for step in steps for run in step.runs)]
            reports.save(reports.make(before.workload, runs), plan.workdir / "report.json")
        return measured, steps, picks

    def _deploy_pick(
        self,
        picks: list[tune.Recommendation],
        steps: list[Step],
        notes: dict[int, str],
        curve: list[float],
        *,
        deployed_k: int,
    ) -> None:
        """End on the pick: deployed through the gate when it is a measured k other than the one the
        host serves now (the last that passed). A pick of 0 (no speculation) is not an override of
        this profile, and is said instead."""
        plan = self.plan
        level = plan.concurrency or max(r.concurrency for r in picks)
        chosen = next((r for r in picks if r.concurrency == level), None)
        serving = next((s.k for s in reversed(steps) if s.deployed), deployed_k)  # a failed k was rolled back
        if chosen is None or chosen.k == serving:
            return
        if chosen.k == 0:
            self.say(f"sweep: the pick at concurrency {level} is no speculation (k=0): not deployed (a profile "
                     f"without speculation is another profile); the host stays on k={serving}")  # fmt: skip
            return
        if chosen.prediction(chosen.k).basis != "measured":
            self.say(f"sweep: the pick k={chosen.k} at concurrency {level} was not measured: not deployed")
            return
        why = f"the pick at concurrency {level}"
        notes[chosen.k] = f"specdeploy tune --sweep: k={chosen.k} ({why}; run by {os.environ.get('USER', '?')})"
        tune.write_override(plan.overrides, plan.profile, chosen.k, curve, notes[chosen.k])
        step = self.deploy(chosen.k)
        step.reason = why
        steps.append(step)


def _curve(report: Report) -> list[float]:
    levels = [lv for run in report.runs for lv in run.levels if lv.per_position]
    if not levels:
        raise tune.TuneError(
            "the deployed stack shows no per-position acceptance: the sweep needs a speculative vLLM stack",
            hint="deploy the profile as it is first (its k), then sweep",
        )
    return list(levels[0].per_position or [])


def _stream(argv: list[str], cwd: Path, log: Path, what: str, say: Any) -> int | None:
    """Run `argv` with its output in `log`; a line every PROGRESS_S naming the step, the time and
    the play's last task. Its exit code, or None when it ran past DEPLOY_TIMEOUT_S (stopped)."""
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        next_line = started + PROGRESS_S
        while proc.poll() is None:
            now = time.monotonic()
            if now - started > DEPLOY_TIMEOUT_S:
                proc.terminate()  # ansible-playbook stops its workers; the host's gate finishes on its own
                proc.wait()
                return None
            if now >= next_line:
                say(f"{what}: {now - started:.0f} s, last: {_last_task(log) or tail(log) or '(nothing yet)'}")
                next_line = now + PROGRESS_S
            time.sleep(0.5)
    return proc.returncode


def _last_task(log: Path) -> str:
    try:
        text = log.read_bytes()[-65536:].decode("utf-8", "replace")
    except OSError:
        return ""
    tasks = [line for line in text.splitlines() if line.startswith(("TASK [", "RUNNING HANDLER ["))]
    return tasks[-1].split("]")[0] + "]" if tasks else ""
