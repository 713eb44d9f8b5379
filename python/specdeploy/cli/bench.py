"""`specdeploy bench run|compare` and `specdeploy tune`: stacks measured side by side with one
workload, and a draft length recommended from what was measured."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core.errors import UsageError

bench_app = base.group("Measure deployed stacks with one workload and compare them (table, JSON, PNG plots).")

OutOpt = Annotated[Path, typer.Option("--out", help="folder for report.json and the PNG plots")]
PlotsOpt = Annotated[bool, typer.Option("--plots/--no-plots", help="draw the PNG plots (needs matplotlib)")]
COLUMNS = ("run", "k", "concurrency", "output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
           "acceptance_length", "per_position", "failed")  # fmt: skip


def _fmt(value: Any) -> Any:
    return round(value, 2) if isinstance(value, float) else ("-" if value is None else value)


def print_report(data: dict[str, Any]) -> None:
    workload = data["workload"]
    title = (
        f"workload {workload['name']} ({data['workload_key']}): {len(workload['prompts'])} prompts, "
        f"{workload['output_tokens']} tokens each, temperature {workload['temperature']:g}"
    )
    table = Table(*COLUMNS, title=title)
    for row in data["rows"]:
        table.add_row(*output.cells(*(_fmt(row[c]) for c in COLUMNS)))
    output.out.print(table)
    for row in data["rows"]:
        if row.get("note"):
            output.out.print(output.line("note: ", f"{row['run']} at {row['concurrency']}: ", row["note"]))
    for name, path in data.get("files", {}).items():
        output.out.print(output.line(f"{name}: ", path), highlight=False)


def _finish(report: Any, out: Path, plots: bool, as_json: bool) -> None:
    from specdeploy.bench import compare
    from specdeploy.bench import plots as draw
    from specdeploy.bench import report as reports

    out.mkdir(parents=True, exist_ok=True)
    files = {"report": str(reports.save(report, out / "report.json"))}
    if plots:
        files["throughput plot"] = str(draw.throughput(report, out / "throughput.png"))
        if (drawn := draw.acceptance(report, out / "acceptance.png")) is not None:
            files["acceptance plot"] = str(drawn)
    data = report.to_json() | {"rows": compare.rows(report), "files": files}
    output.emit(data, as_json, lambda: print_report(data))


@bench_app.command("run")
def bench_run(
    out: OutOpt,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            "--profile",
            "-p",
            help="each endpoint's profile, name or file (default on an engine host: the copy its engine unit names)",
        ),
    ] = None,
    endpoint: Annotated[
        list[str] | None,
        typer.Option(help="each engine's base URL (default: this host's engine, http://127.0.0.1:<profile port>)"),
    ] = None,
    python: Annotated[
        str | None, typer.Option(help="a python that imports vllm (default on an engine host: the engine's own)")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="the served target's folder (default on an engine host: the served one)")
    ] = None,
    state_dir: base.StateDirOpt = None,
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    label: Annotated[list[str] | None, typer.Option(help="each endpoint's label (default: its profile's name)")] = None,
    workload: Annotated[
        Path | None,
        typer.Option(help="a workload file (default: the profile's free-form and acceptance prompts)"),
    ] = None,
    timeout: Annotated[float, typer.Option(min=1, help="seconds one level may take")] = 3600.0,
    plots: PlotsOpt = True,
    as_json: base.JsonOpt = False,
) -> None:
    """Run one workload against each endpoint in turn, at concurrency 1 and the profile's higher levels,
    with `vllm bench serve`; acceptance from the engine's counters around each level. The API key,
    where the engine needs one, is read from $SPECDEPLOY_API_KEY (never argv). Writes report.json and
    the plots into --out. Exit 0 measured, 1 the benchmark failed, 2 bad input."""
    from specdeploy.bench import report as reports
    from specdeploy.bench import run as bench
    from specdeploy.bench import workload as workloads
    from specdeploy.engine import secret
    from specdeploy.profile import load_profile
    from specdeploy.smoke.clients import endpoint_problem

    labels = label or []
    if not profile:  # the served stack's own: the copy the installed unit names (also after a rollback)
        from specdeploy.core import layout
        from specdeploy.watch.run import profile_file_of_unit

        profile = [str(profile_file_of_unit(tuple(layout.UNIT_FILES.values())))]
    profiles = [load_profile(p) for p in profile]
    endpoint = endpoint or [f"http://127.0.0.1:{p.engine.serve.port}" for p in profiles]
    if len(profile) != len(endpoint) or (labels and len(labels) != len(endpoint)):
        raise UsageError(
            f"--profile given {len(profile)} times, --endpoint {len(endpoint)}, --label {len(labels)}: expected one "
            "profile (and label, if any) per endpoint",
            hint="repeat --profile and --endpoint in pairs, in the same order",
        )
    for url in endpoint:
        if problem := endpoint_problem(url):
            raise UsageError(
                f"--endpoint {url!r}: {problem}", hint="give the engine's base URL, e.g. http://127.0.0.1:8000"
            )
    if plots:  # refused before the benchmark runs, not after
        from specdeploy.bench import plots as draw

        draw.available()
    host = base.host_layout(models_dir=models_dir, serving_dir=serving_dir, state_dir=state_dir)
    if python is None or tokenizer is None:
        found_python, found_tokenizer = bench.host_defaults(profiles[0], host)
        python, tokenizer = python or found_python, tokenizer or found_tokenizer
    chosen = workloads.load(workload, profiles[0]) if workload else workloads.from_profile(profiles[0])
    names = labels or [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise UsageError(f"labels {names}: expected one per endpoint, all different", hint="pass --label for each")
    runs = []
    for prof, url, name in zip(profiles, endpoint, names, strict=True):
        key = secret.read(prof, host)  # $SPECDEPLOY_API_KEY, else the host's key file: never argv
        served = prof.engine.serve.served_model_name
        if served != chosen.served_model:
            raise UsageError(
                f"profile {prof.name} serves {served!r}, the workload asks {chosen.served_model!r}: runs of one "
                "report must serve one model",
                hint="bench other models in separate reports",
            )
        target = bench.Target(prof, url.rstrip("/"), name, api_key=key)
        runs.append(
            bench.measure(target, chosen, python=python, tokenizer=tokenizer, workdir=out / "raw" / name,
                          timeout=timeout, say=lambda line: output.err.print(line, highlight=False, markup=False))
        )  # fmt: skip
    _finish(reports.make(chosen, runs), out, plots, as_json)


@bench_app.command("compare")
def bench_compare(
    reports_in: Annotated[list[Path], typer.Argument(help="report.json files of `bench run`", metavar="REPORT")],
    out: OutOpt,
    plots: PlotsOpt = True,
    as_json: base.JsonOpt = False,
) -> None:
    """Merge reports taken at different times or on different hosts into one table, JSON and plots.
    Refuses (exit 2) reports of different workloads, naming the fields that differ."""
    from specdeploy.bench import compare
    from specdeploy.bench import report as reports

    merged = compare.merge([(str(p), reports.load(p)) for p in reports_in])
    _finish(merged, out, plots, as_json)


def _print_picks(picks: list[Any]) -> None:
    for rec in picks:
        if rec.predictions:
            table = Table("k", "tok/s", "tokens/step", "step ms", "basis", title=f"concurrency {rec.concurrency}")
            for p in rec.predictions:
                mark = " <- pick" if p.k == rec.k else ""
                table.add_row(*output.cells(p.k, f"{p.tok_s:.1f}{mark}", f"{p.acceptance_length:.2f}",
                                            f"{p.step_ms:.1f}", p.basis))  # fmt: skip
        else:  # tune.acceptance_bound: tokens per step only (no step time)
            table = Table("k", "tokens/step", title=f"concurrency {rec.concurrency}: acceptance only")
            for k in range(len(rec.curve) + 1):
                mark = " <- at most" if k == rec.k else ""
                table.add_row(*output.cells(k, f"{1.0 + sum(rec.curve[:k]):.2f}{mark}"))
        output.out.print(table)
        output.out.print(output.line("model: ", rec.fit), highlight=False)
        for reason in rec.reasons:
            output.out.print(output.line("  ", reason), highlight=False)
        if rec.predictions:
            output.out.print(f"recommended at concurrency {rec.concurrency}: num_speculative_tokens = {rec.k}")
        else:  # tune.acceptance_bound: no step time, an upper bound only
            output.out.print(f"at concurrency {rec.concurrency}: num_speculative_tokens = {rec.k} at most")


def _ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ks = []
    if not ks or any(not 1 <= k <= 64 for k in ks) or len(set(ks)) != len(ks):
        raise UsageError(
            f"--sweep {text!r}: expected `auto` or distinct draft lengths 1..64 separated by commas, e.g. 1,2,4"
        )
    return ks


def tune(
    from_report: Annotated[
        Path | None,
        typer.Option(
            "--from-report",
            help="a bench report: a run at the drafter's largest k and one without (with --sweep: runs measured "
            "before, e.g. the stack without speculation, that join the sweep's)",
        ),
    ] = None,
    max_k: Annotated[int | None, typer.Option(min=1, max=64, help="the largest k to consider (the drafter's)")] = None,
    apply: Annotated[
        Path | None,
        typer.Option(
            "--apply",
            help="write the pick as a site override <DIR>/<profile>.yaml (the inventory's profiles folder; "
            "the host's specdeploy_profiles_src points there), for a gated deploy",
        ),
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", help="with --apply or --sweep: the host's profile")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1, help="with --apply or --sweep: the level whose pick is applied or deployed (default: the highest)"
        ),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            "--sweep",
            help="draft lengths to deploy and measure, e.g. 1,2,4, or `auto`: where the model points, until the "
            "pick and its neighbours are measured (each a gated deploy)",
        ),
    ] = None,
    inventory: Annotated[Path | None, typer.Option(help="with --sweep: the site's inventory")] = None,
    host: Annotated[str | None, typer.Option(help="with --sweep: the engine host, as the inventory names it")] = None,
    overrides: Annotated[
        Path | None, typer.Option(help="with --sweep: the folder the override is written to (the host's profiles)")
    ] = None,
    playbook: Annotated[Path, typer.Option(help="with --sweep: the site's deploy play")] = Path("deploy.yml"),
    extra_var: Annotated[
        list[str] | None, typer.Option("--extra-var", "-e", help="with --sweep: K=V for every deploy (repeat)")
    ] = None,
    vault_password_file: Annotated[Path | None, typer.Option(help="with --sweep: for the play")] = None,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="with --sweep: bench runs per k")] = 1,
    bench_arg: Annotated[
        list[str] | None, typer.Option(help="with --sweep: an option for `bench run` on the host (repeat)")
    ] = None,
    workload: Annotated[Path | None, typer.Option(help="with --sweep: the workload file")] = None,
    deploy_pick: Annotated[
        bool,
        typer.Option(
            help="with --sweep: end with the pick deployed through the gate when it is a measured k the host does "
            "not serve yet"
        ),
    ] = True,
    out: Annotated[Path | None, typer.Option(help="with --sweep: the folder for the sweep's report")] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Recommend num_speculative_tokens per level of concurrency from measured runs: the throughput
    of every k predicted from per-position acceptance and step times (what was measured shown as
    measured, the rest labelled interpolated or extrapolated), the pick and its reasons.

    --from-report FILE answers offline. --sweep K,K,... measures: each k is written as a site
    override and deployed with the site's play through the gate (a k that fails its gate is rolled
    back by the play, recorded, never measured), then benched on the host. --sweep auto measures
    where the model points (the pick and its neighbours, refitted after each), best with
    --from-report holding a run without speculation of the same workload. Exit 0, 1 a sweep's k failed
    its gate (the others measured), 2 bad input."""
    from specdeploy.bench import report as reports
    from specdeploy.bench import tune as tuner
    from specdeploy.profile import load_profile

    if from_report is None and sweep is None:
        raise UsageError("give --from-report FILE, --sweep K,K,... or both", hint="offline, measured, or both")
    if (apply is not None or sweep is not None) and profile is None:
        raise UsageError("--apply and --sweep need --profile: the profile the override extends", hint="pass --profile")
    data: dict[str, Any] = {}
    failed = False
    if sweep is not None:
        from specdeploy.bench import sweep as sweeps

        ks = None if sweep.strip() == "auto" else _ks(sweep)
        given = {"--inventory": inventory, "--host": host, "--overrides": overrides, "--out": out}
        missing = [name for name, value in given.items() if value is None]
        if missing or inventory is None or host is None or overrides is None or out is None:
            raise UsageError(f"--sweep needs {', '.join(missing)}", hint="pass --inventory, --host, --overrides, --out")
        plan = sweeps.Plan(
            profile=load_profile(profile or ""), ks=ks,
            max_k=max_k, baseline=reports.load(from_report) if from_report is not None else None,
            inventory=inventory.absolute(), host=host,
            playbook=playbook.absolute(), overrides=overrides.absolute(), workdir=out.absolute(),
            extra_vars=extra_var or [], repeats=repeats,
            vault_password_file=vault_password_file.absolute() if vault_password_file else None,
            bench_args=bench_arg or [], workload=workload, deploy_pick=deploy_pick, concurrency=concurrency,
        )  # fmt: skip
        say = lambda line: output.err.print(line, highlight=False, markup=False)  # noqa: E731
        report, steps, picks = sweeps.Sweep(plan, say).run()  # it saves <out>/report.json itself
        failed = any(not s.deployed for s in steps)
        data = {"report": str(out / "report.json"), "steps": [s.to_json() for s in steps]}
    else:
        assert from_report is not None
        given = reports.load_any(from_report)  # a bench report, or a gate report read as one
        data = {"report": str(from_report)}
        try:
            picks = tuner.recommend(given, max_k)
        except tuner.DraftCostUnknown as exc:
            picks = tuner.acceptance_bound(given, max_k)  # one speculative run (a gate report): a bound only
            data["bound_only"] = f"{exc.message}: acceptance alone bounds k from above"
    data["recommendations"] = [r.to_json() for r in picks]
    if apply is not None and profile is not None:
        if not picks or "bound_only" in data:
            raise UsageError(
                "--apply: there is no recommendation to write" + (f" ({data['bound_only']})" if picks else ""),
                hint="measure the runs tune asks for (a run without speculation of the same workload), then apply",
            )
        level = concurrency or max(r.concurrency for r in picks)
        chosen = next((r for r in picks if r.concurrency == level), None)
        if chosen is None:
            raise UsageError(
                f"--concurrency {level}: the report measured {', '.join(str(r.concurrency) for r in picks)}",
                hint="pass one of the report's levels",
            )
        base_profile = load_profile(profile)
        if sweep is not None:
            measured = {run.profile for run in report.runs}
        else:
            assert from_report is not None
            measured = {run.profile for run in reports.load_any(from_report).runs}
        if base_profile.name not in measured:
            raise UsageError(
                f"--profile {base_profile.name}: the report measured {', '.join(sorted(measured))}: its figures are "
                "another stack's",
                hint="apply a report of the profile's own stack",
            )
        note = f"k={chosen.k} recommended at concurrency {level} from {Path(data['report']).name} ({chosen.reasons[0]})"
        written = tuner.write_override(apply, base_profile, chosen.k, chosen.curve, note)
        data["applied"] = {"file": str(written), "k": chosen.k, "concurrency": level}

    def show() -> None:
        for step in data.get("steps", []):
            gate = step["gate"] or {}
            passed = "passed its gate, measured" if step["runs"] else "passed its gate (deployed, serving)"
            how = passed if step["deployed"] else (
                f"FAILED its gate ({gate.get('verdict') or 'not reached'}): rolled back, not measured"
            )  # fmt: skip
            output.out.print(
                output.line(f"k={step['k']}: ", how, f" ({step['reason']}; run {step['run_id']}, log {step['log']})")
            )
        _print_picks(picks)
        if "applied" in data:
            output.out.print(output.line("site override written: ", data["applied"]["file"]), highlight=False)
            output.out.print(
                output.line(
                    "next: deploy it through the gate: set specdeploy_profiles_src to that folder for the host "
                    "(host_vars) and run `ansible-playbook deploy.yml -l HOST`; a k that fails its gate is rolled back"
                ),
                highlight=False,
            )

    if sweep is not None and out is not None:  # the sweep's record beside its report: each k, why, its gate, the pick
        from specdeploy.core import atomic

        data["record"] = str(out / "sweep.json")
        atomic.write_json(out / "sweep.json", data)
    output.emit(data, as_json, show)
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
    app.command("tune")(tune)
