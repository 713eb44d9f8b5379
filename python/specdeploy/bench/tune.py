"""Recommend a draft length (`num_speculative_tokens`, k) per level of concurrency from measured runs.

Failure prevented: the field ran 15 draft tokens where acceptance was about 0 from position 5 on
(40-42 tok/s), and found 5 (57-61 tok/s) by reading logs and cutting by hand.

The model (one formula, here):
- tokens per step with k drafts: L(k) = 1 + p_1 + ... + p_k, p_i the share of drafts accepted up to
  position i (vLLM's per-position counter over drafts, cumulative), from the measured run with the
  largest k; positions past it are extrapolated geometrically from its last two (labelled).
- time per step: t(k) = a + b*k for k >= 1, fitted (least squares) to the measured runs' step times
  (Level.step_ms: L * concurrency / throughput); t(0) is the run without speculation where there is
  one. With one speculative run and one without, the line goes through both.
- throughput: concurrency * L(k) / t(k).
Where a k was measured, its measured throughput is what the pick compares (the model only fills the
gaps); every other figure is labelled interpolated or extrapolated. The pick is the smallest k within
1% of the best (fewer drafts: less compute for the same throughput), with its reasons.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from specdeploy.bench.report import Level, Report, Run, make
from specdeploy.core import atomic
from specdeploy.core.errors import UsageError
from specdeploy.profile import Profile

NEAR_BEST = 0.01  # a smaller k within 1% of the best is preferred


class TuneError(UsageError):
    """The runs given cannot support a recommendation (what is missing is named)."""


class DraftCostUnknown(TuneError):
    """One speculative run and none without: acceptance is known, the cost of a draft is not
    (`acceptance_bound` still answers from acceptance alone)."""


@dataclass(frozen=True)
class Prediction:
    k: int
    tok_s: float  # what the pick compares: measured where measured, else the model's
    model_tok_s: float
    acceptance_length: float
    step_ms: float
    basis: str  # "measured", "interpolated" or "extrapolated: <why>"
    measured_tok_s: float | None = None


@dataclass(frozen=True)
class Recommendation:
    concurrency: int
    k: int
    predictions: list[Prediction]
    reasons: list[str] = field(default_factory=list)
    fit: str = ""
    curve: list[float] = field(default_factory=list)  # per-position acceptance the model used

    def prediction(self, k: int) -> Prediction:
        return next(p for p in self.predictions if p.k == k)

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "recommended_k": self.k,
            "fit": self.fit,
            "reasons": self.reasons,
            "predictions": [p.__dict__ for p in self.predictions],
        }


def _curve(levels: list[tuple[int, Level]], max_k: int, concurrency: int) -> tuple[list[float], int]:
    """Per-position acceptance for positions 1..max_k and how many were measured."""
    with_positions = [(k, lv) for k, lv in levels if k > 0 and lv.per_position]
    if not with_positions:
        raise TuneError(
            f"no speculative run with per-position acceptance at concurrency {concurrency}",
            hint="bench a stack at the drafter's largest k on vLLM (SGLang does not expose per-position acceptance)",
        )
    _, richest = max(with_positions, key=lambda kl: (len(kl[1].per_position or []), kl[0]))
    measured = list(richest.per_position or [])
    return extend(measured, max_k), len(measured)


def _step_line(
    levels: list[tuple[int, Level]], concurrency: int
) -> tuple[float, float, float | None, tuple[int, int], str]:
    """(a, b, t0, measured k range, how) of the step-time model."""
    # a speculative run without acceptance figures (no counters) has no known tokens per step: left out
    spec = [(k, lv.step_ms) for k, lv in levels if k > 0 and lv.step_ms is not None and lv.mean_acceptance_length]
    plain = [lv.step_ms for k, lv in levels if k == 0 and lv.step_ms is not None]
    t0 = float(np.median(plain)) if plain else None
    ks = sorted({k for k, _ in spec})
    if not ks:
        raise TuneError(f"no speculative run at concurrency {concurrency}", hint="bench a stack with speculation on")
    if len(ks) >= 2:
        x = np.array([k for k, _ in spec], dtype=float)
        y = np.array([t for _, t in spec], dtype=float)
        b, a = np.polyfit(x, y, 1)
        how = f"t(k) = {a:.2f} + {b:.3f}*k ms fitted to {len(spec)} speculative runs (k = {', '.join(map(str, ks))})"
        if b < 0:  # noise: a flat line through the runs' mean, not the tilted line's intercept
            b, a = 0.0, float(np.mean(y))
            how += f"; its slope came out negative (noise): taken as 0, t(k) = {a:.2f} ms"
    elif t0 is not None:
        k1 = ks[0]
        t1 = float(np.median([t for _, t in spec]))  # every run at that k
        a, b = t0, (t1 - t0) / k1
        how = f"t(k) = {a:.2f} + {b:.3f}*k ms through the run without speculation and the run at k={k1}"
    else:
        raise DraftCostUnknown(
            f"one speculative run (k={ks[0]}) and none without speculation: the cost of a draft token is unknown",
            hint="bench the same stack without speculation too, or at a second k",
        )
    low = 0 if len(ks) == 1 else ks[0]  # one speculative run: the line runs from the run without speculation
    if b < 0:  # the line through one speculative run and none: a faster speculative step than a plain one
        how += f"; the slope {b:.3f} came out negative (noise) and is taken as 0"
        b = 0.0
    return float(a), float(b), t0, (low, ks[-1]), how


def recommend_level(
    report: Report, concurrency: int, max_k: int | None = None, failed: frozenset[int] = frozenset()
) -> Recommendation:
    """`failed`: draft lengths whose deploy failed its gate: predicted and shown, never picked."""
    levels = [(run.k, lv) for run in report.runs if (lv := run.level(concurrency)) and lv.output_tokens_per_s > 0]
    if not levels:
        raise TuneError(f"no run measured concurrency {concurrency}")
    top = max_k if max_k is not None else max(k for k, _ in levels)
    curve, widths = _curve(levels, top, concurrency)
    a, b, t0, (k_lo, k_hi), how = _step_line(levels, concurrency)
    measured: dict[int, list[Level]] = {}
    for k, lv in levels:
        measured.setdefault(k, []).append(lv)
    predictions: list[Prediction] = []
    for k in range(0, top + 1):
        length = 1.0 + sum(curve[:k])
        step = t0 if (k == 0 and t0 is not None) else a + b * k
        model = 1000.0 * concurrency * length / step
        seen = float(np.median([lv.output_tokens_per_s for lv in measured[k]])) if k in measured else None
        if k in failed:
            basis = "failed its gate: not a candidate"
        elif seen is not None:
            basis = "measured"
            # what was measured at this k, not the model: its own acceptance and step time
            length = float(np.median([lv.mean_acceptance_length or 1.0 for lv in measured[k]]))
            step = 1000.0 * concurrency * length / seen
        elif k == 0:
            basis = "extrapolated: no run without speculation (the step line at k=0)"
        elif k > widths:
            basis = f"extrapolated: acceptance past position {widths} continues the measured decay"
        elif k < k_lo or k > k_hi:
            basis = f"extrapolated: step time outside the measured k = {k_lo}..{k_hi}"
        else:
            basis = "interpolated"
        predictions.append(Prediction(k, seen if seen is not None else model, model, length, step, basis, seen))
    candidates = [p for p in predictions if p.k not in failed]
    if not candidates:
        raise TuneError(f"every k from 0 to {top} failed its gate at concurrency {concurrency}: nothing to pick")
    best = max(p.tok_s for p in candidates)
    pick = min(p.k for p in candidates if p.tok_s >= best * (1 - NEAR_BEST))
    return Recommendation(concurrency, pick, predictions, _reasons(predictions, pick, curve), how, curve)


def _reasons(predictions: list[Prediction], pick: int, curve: list[float]) -> list[str]:
    chosen = predictions[pick]
    reasons = [
        f"k={pick}: {chosen.tok_s:.1f} tok/s ({chosen.basis}), {chosen.acceptance_length:.2f} tokens per step "
        f"of {chosen.step_ms:.1f} ms"
    ]
    plain = predictions[0]
    if pick > 0:
        gain = chosen.tok_s / plain.tok_s - 1 if plain.tok_s > 0 else 0.0
        reasons.append(f"no speculation: {plain.tok_s:.1f} tok/s ({plain.basis}); k={pick} is {gain:+.0%}")
    if pick + 1 < len(predictions):
        nxt = predictions[pick + 1]
        more = nxt.step_ms - chosen.step_ms  # from 0 to 1 this includes a speculative step's fixed cost
        reasons.append(
            f"k={pick + 1} would add {curve[pick]:.2f} tokens per step (+{curve[pick] / chosen.acceptance_length:.0%}) "
            f"for {more:.2f} ms more per step ({more / chosen.step_ms:+.0%}): {nxt.tok_s:.1f} tok/s ({nxt.basis})"
        )
    worst = predictions[-1]
    if worst.k != pick:
        reasons.append(f"k={worst.k} (the largest considered): {worst.tok_s:.1f} tok/s ({worst.basis})")
    return reasons


def recommend(report: Report, max_k: int | None = None, failed: frozenset[int] = frozenset()) -> list[Recommendation]:
    levels = sorted({lv.concurrency for run in report.runs for lv in run.levels})
    return [recommend_level(report, c, max_k, failed) for c in levels]


def acceptance_bound(report: Report, max_k: int | None = None) -> list[Recommendation]:
    """What acceptance alone says where no step time can be fitted (one speculative run, as a gate
    report holds): a larger k cannot be more than NEAR_BEST faster than k* = the smallest k whose
    tokens per step reach (1 - NEAR_BEST) of the largest k's, since a step never gets cheaper with
    more drafts. So k* is an upper bound on the pick; whether fewer (or none) is faster needs the
    cost of a draft, which a run without speculation gives."""
    out: list[Recommendation] = []
    for concurrency in sorted({lv.concurrency for run in report.runs for lv in run.levels}):
        levels = [(run.k, lv) for run in report.runs if (lv := run.level(concurrency))]
        top = max_k if max_k is not None else max(k for k, _ in levels)
        curve, widths = _curve(levels, top, concurrency)
        lengths = [1.0 + sum(curve[:k]) for k in range(top + 1)]
        bound = min(k for k in range(1, top + 1) if lengths[k] >= (1 - NEAR_BEST) * lengths[top])
        shares = ", ".join(f"{p:.2f}" for p in curve)
        extrapolated = f"; past position {widths} extrapolated" if top > widths else ""
        if bound < top:
            first = (
                f"k={bound} at most: {lengths[bound]:.2f} tokens per step, and k={top} only {lengths[top]:.2f} "
                f"(per-position acceptance {shares}{extrapolated})"
            )
        else:
            first = f"k={top} at most (the largest considered): every position adds tokens ({shares}{extrapolated})"
        reasons = [
            first,
            "a step never gets cheaper with more drafts, so no larger k is more than "
            f"{NEAR_BEST:.0%} faster; whether a smaller k (or none) is faster needs the cost of a draft: bench the "
            "stack without speculation (or at a second k) with the same workload and tune on both",
        ]
        out.append(Recommendation(concurrency, bound, [], reasons, "acceptance only: no step time fitted", curve))
    return out


# --------------------------------------------------------------------------- which k to measure next


def next_k(report: Report, max_k: int, tried: set[int], failed: frozenset[int] = frozenset()) -> tuple[int | None, str]:
    """The next draft length `tune --sweep auto` deploys and measures, with why; None when done.

    Two runs (the largest k and none) cannot see a speculative step's fixed cost (the step line
    through them spreads it over every k), so the model alone may miss the best k by more than
    noise (docs/benchmarks.md, "Compare and tune"). The search measures where the model points
    instead: at each level, the pick and its neighbours (k - 1, k + 1) that are not yet measured
    (or failed their gate), the one the model rates highest first; the model is refitted after each
    measure. A k in `failed` (its deploy failed its gate) is never picked. It stops when every
    level's pick is measured and so are its neighbours (k=0 is the run without speculation, not a
    deploy: without one, a pick of 0 is extrapolated, and said so): a measured local best. While
    the runs support no model (one speculative run and none without: the step line has one point),
    the untried k nearest the middle of 1..max_k is measured. At most max_k steps."""
    try:
        recommendations = recommend(report, max_k=max_k, failed=failed)
    except TuneError as exc:
        untried = [k for k in range(1, max_k + 1) if k not in tried]
        if not untried:
            return None, f"no recommendation ({exc.message}) and every k from 1 to {max_k} was tried"
        middle = min(untried, key=lambda k: (abs(k - max_k / 2), k))
        return middle, f"a second point for the step line ({exc.message})"
    wanted: list[tuple[float, int, str]] = []
    for rec in recommendations:
        for k in (rec.k, rec.k - 1, rec.k + 1):
            if 1 <= k <= max_k and k not in tried:
                predicted = rec.prediction(k)
                why = f"concurrency {rec.concurrency}: the pick is k={rec.k}; k={k} is {predicted.basis} at " + (
                    f"{predicted.tok_s:.1f} tok/s"
                )
                wanted.append((predicted.tok_s, -k, why))
    if not wanted:
        picks = ", ".join(f"k={rec.k} at concurrency {rec.concurrency}" for rec in recommendations)
        unmeasured = [rec for rec in recommendations if rec.prediction(rec.k).basis != "measured"]
        caveat = (
            "; no speculation (k=0) is extrapolated: bench the stack without speculation and give it with "
            "--from-report to confirm"
            if unmeasured
            else ""
        )
        return None, f"every pick ({picks}) and its neighbours are measured or failed their gate{caveat}"
    _, negative_k, why = max(wanted)
    return -negative_k, why


def search(
    report: Report,
    max_k: int,
    measure: Callable[[int, str], list[Run] | None],
    ks: list[int] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> tuple[Report, list[int]]:
    """Measure draft lengths one at a time: `ks` in order, or (None: `tune --sweep auto`) where
    `next_k` points. `measure(k, why)` deploys and measures k (its runs), or None when k failed its
    gate. The report with every run added, and the k that failed."""
    runs = list(report.runs)
    tried = {run.k for run in runs}
    failed: list[int] = []
    queue = list(ks) if ks is not None else None
    while True:
        if queue is not None:
            if not queue:
                break
            k, why = queue.pop(0), "asked for"
        else:
            chosen, why = next_k(make(report.workload, runs), max_k, tried, frozenset(failed))
            if chosen is None:
                say(f"search: done: {why}")
                break
            k = chosen
            say(f"search: next k={k}: {why}")
        tried.add(k)
        got = measure(k, why)
        if got is None:
            failed.append(k)
        else:
            runs += got
    return make(report.workload, runs), failed


# --------------------------------------------------------------------------- the chosen k as a site override

LOOP_MARGIN = 0.05  # a band's upper edge stays this far under k + 1, where a token loop (all accepted) sits


def _scaled(value: float, length_k: float, length_base: float) -> float:
    """A floor of acceptance length measured at the base k, moved to another k: its gain over 1 (one
    token a step, no speculation) scaled by the gain the per-position curve predicts there."""
    return round(1.0 + (value - 1.0) * (length_k - 1.0) / (length_base - 1.0), 2)


def extend(curve: list[float], width: int) -> list[float]:
    """The per-position curve to `width` positions: past the measured ones, the last two positions'
    ratio continues (at most 0.95; a single position or a zero: nothing past it)."""
    out = [min(1.0, max(0.0, p)) for p in curve][:width]
    ratio = min(max(out[-1] / out[-2], 0.0), 0.95) if len(out) >= 2 and out[-2] > 0 else 0.0
    while out and len(out) < width:
        out.append(out[-1] * ratio)
    return out


def overrides_for(profile: Profile, k: int, curve: list[float]) -> dict[str, Any]:
    """What a site override must set for `k`, by dotted field: the draft length, and the acceptance
    bands that depend on it. The profile's band was measured at its own k (K): its lower edge's gain
    over 1 moves along the measured per-position curve; its upper edge keeps the profile's distance
    under the loop ceiling (K + 1, every draft accepted), scaled by k / K, and at least LOOP_MARGIN."""
    if profile.site_override is not None:
        raise TuneError(
            f"profile {profile.name} is itself a site override ({profile.site_override.file}): bands are moved from "
            "the shipped profile's own",
            hint="pass --profile NAME, the shipped profile the override extends",
        )
    base_k = profile.engine.speculative.num_speculative_tokens
    band = profile.smoke.acceptance_length
    if k == base_k:
        return {"engine.speculative.num_speculative_tokens": k}
    if not curve:
        raise TuneError("no per-position acceptance measured: the bands for another k cannot be moved",
                        hint="measure a speculative run of this stack first")  # fmt: skip
    points = extend(curve, max(k, base_k))
    length_base, length_k = 1.0 + sum(points[:base_k]), 1.0 + sum(points[:k])
    if length_base - 1.0 <= 1e-9:
        raise TuneError(
            f"the measured per-position acceptance is {', '.join(f'{p:.2f}' for p in curve)}: no draft was accepted, "
            "so no band can be moved to another k",
            hint="check the stack's acceptance first (`specdeploy smoke`): a collapsed drafter is a fault, not a k",
        )
    low = max(1.0 + LOOP_MARGIN, _scaled(band.min, length_k, length_base))
    gap = max(LOOP_MARGIN, (base_k + 1 - band.max) * k / base_k)
    high = round(k + 1 - gap, 2)
    extrapolated = f" (past position {len(curve)}: extrapolated)" if len(curve) < max(k, base_k) else ""
    source = (
        f"specdeploy tune: the profile's band [{band.min}, {band.max}] at k={base_k} moved to k={k}: lower edge along "
        f"the measured per-position acceptance ({', '.join(f'{p:.2f}' for p in points)}){extrapolated}; upper edge "
        f"{gap:.2f} under the loop ceiling k + 1 = {k + 1}"
    )
    flat: dict[str, Any] = {
        "engine.speculative.num_speculative_tokens": k,
        "smoke.acceptance_length.min": min(low, high),
        "smoke.acceptance_length.max": high,
        "smoke.acceptance_length.source": source,
    }
    if profile.watch.acceptance_length_min is not None:
        flat["watch.acceptance_length_min"] = max(
            1.0 + LOOP_MARGIN, _scaled(profile.watch.acceptance_length_min, length_k, length_base)
        )
    return flat


def check_directory(directory: Path) -> None:
    """A site override never goes where profiles are looked up by name (it would stand in for the
    shipped profile it extends, which then cannot be found)."""
    from specdeploy.profile.load import profile_dirs

    here = directory.resolve()
    for shipped in profile_dirs():
        if shipped.resolve() == here:
            raise TuneError(
                f"{directory} is where profiles are looked up by name ({shipped}): an override there would replace "
                "the profile it extends",
                hint="write it into the inventory's own folder (e.g. inventory/profiles) and point the host's "
                "specdeploy_profiles_src there",
            )


def write_override(directory: Path, profile: Profile, k: int, curve: list[float], note: str) -> Path:
    """`<directory>/<profile>.yaml`: the site override for `k` (profile.load `extends`), written
    atomically and loaded back (a value the schema refuses is never left on disk)."""
    from specdeploy.profile.load import load_profile

    nested: dict[str, Any] = {}
    for name, value in overrides_for(profile, k, curve).items():
        *parents, leaf = name.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    document = {"schema_version": 1, "extends": profile.name, "note": note, "overrides": nested}
    text = (
        f"# Site override of {profile.name}, written by `specdeploy tune --apply`: deploy it through the gate "
        "(ansible-playbook deploy.yml -l HOST).\n# Regenerate rather than edit; delete it to go back to the "
        "profile's own draft length.\n" + yaml.safe_dump(document, sort_keys=False)
    )
    check_directory(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{profile.name}.yaml"
    if path.exists():
        from specdeploy.profile.load import is_override, read_profile_data

        if not is_override(read_profile_data(path)):
            raise TuneError(
                f"{path} is a whole profile, not a site override: it is left as it is",
                hint="write overrides into a folder of their own",
            )
    with tempfile.TemporaryDirectory(dir=directory, prefix=".check-") as scratch:
        staged = Path(scratch) / path.name  # the loader wants the file named as the profile it extends
        atomic.write_bytes(staged, text.encode())
        load_profile(staged)  # refused here (ProfileError naming the field), never on a host
        os.replace(staged, path)
    return path
