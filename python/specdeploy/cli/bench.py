"""`specdeploy bench run|compare` and `specdeploy tune`: stacks measured side by side with one
workload, and a draft length recommended from what was measured."""

from __future__ import annotations

import os
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
    profile: Annotated[list[str], typer.Option("--profile", "-p", help="each endpoint's profile (name or file)")],
    endpoint: Annotated[list[str], typer.Option(help="each engine's base URL, on its host's loopback")],
    python: Annotated[str, typer.Option(help="a python of the engine's environment (it imports vllm)")],
    tokenizer: Annotated[Path, typer.Option(help="the served target's model folder (its tokenizer)")],
    out: OutOpt,
    label: Annotated[list[str] | None, typer.Option(help="each endpoint's label (default: its profile's name)")] = None,
    workload: Annotated[
        Path | None,
        typer.Option(help="a workload file (default: the profile's free-form and acceptance prompts)"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds one level may take")] = 3600.0,
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
    from specdeploy.profile import load_profile
    from specdeploy.smoke.clients import endpoint_problem

    labels = label or []
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
    profiles = [load_profile(p) for p in profile]
    chosen = workloads.load(workload, profiles[0]) if workload else workloads.from_profile(profiles[0])
    names = labels or [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise UsageError(f"labels {names}: expected one per endpoint, all different", hint="pass --label for each")
    key = os.environ.get("SPECDEPLOY_API_KEY") or None
    runs = []
    for prof, url, name in zip(profiles, endpoint, names, strict=True):
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


def tune(
    from_report: Annotated[
        Path, typer.Option("--from-report", help="a bench report: a run at the drafter's largest k and one without")
    ],
    max_k: Annotated[int | None, typer.Option(min=1, max=64, help="the largest k to consider (the drafter's)")] = None,
    apply: Annotated[
        Path | None,
        typer.Option(
            "--apply",
            help="write the pick as a site override <DIR>/<profile>.yaml (the inventory's profiles folder; "
            "the host's specdeploy_profiles_src points there), for a gated deploy",
        ),
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", "-p", help="with --apply: the host's profile")] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="with --apply: the level whose pick is applied (default: the highest)")
    ] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Recommend num_speculative_tokens per level of concurrency from measured runs: the throughput
    of every k predicted from per-position acceptance and step times (what was measured shown as
    measured, the rest labelled interpolated or extrapolated), the pick and its reasons."""
    from specdeploy.bench import report as reports
    from specdeploy.bench import tune as tuner

    if apply is not None and profile is None:
        raise UsageError("--apply needs --profile: the profile the override extends", hint="pass --profile NAME")
    picks = tuner.recommend(reports.load(from_report), max_k)
    data: dict[str, Any] = {"report": str(from_report), "recommendations": [r.to_json() for r in picks]}
    if apply is not None and profile is not None:
        from specdeploy.profile import load_profile

        level = concurrency or max(r.concurrency for r in picks)
        chosen = next((r for r in picks if r.concurrency == level), None)
        if chosen is None:
            raise UsageError(
                f"--concurrency {level}: the report measured {', '.join(str(r.concurrency) for r in picks)}",
                hint="pass one of the report's levels",
            )
        note = f"k={chosen.k} recommended at concurrency {level} from {from_report.name} ({chosen.reasons[0]})"
        written = tuner.write_override(apply, load_profile(profile), chosen.k, chosen.curve, note)
        data["applied"] = {"file": str(written), "k": chosen.k, "concurrency": level}

    def show() -> None:
        for rec in picks:
            table = Table("k", "tok/s", "tokens/step", "step ms", "basis", title=f"concurrency {rec.concurrency}")
            for p in rec.predictions:
                mark = " <- pick" if p.k == rec.k else ""
                table.add_row(*output.cells(p.k, f"{p.tok_s:.1f}{mark}", f"{p.acceptance_length:.2f}",
                                            f"{p.step_ms:.1f}", p.basis))  # fmt: skip
            output.out.print(table)
            output.out.print(output.line("model: ", rec.fit), highlight=False)
            for reason in rec.reasons:
                output.out.print(output.line("  ", reason), highlight=False)
            output.out.print(f"recommended at concurrency {rec.concurrency}: num_speculative_tokens = {rec.k}")
        if "applied" in data:
            output.out.print(output.line("site override written: ", data["applied"]["file"]), highlight=False)
            output.out.print(
                output.line(
                    "next: deploy it through the gate: set specdeploy_profiles_src to that folder for the host "
                    "(host_vars) and run `ansible-playbook deploy.yml -l HOST`; a k that fails its gate is rolled back"
                ),
                highlight=False,
            )

    output.emit(data, as_json, show)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
    app.command("tune")(tune)
