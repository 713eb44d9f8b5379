"""The smoke's diagnosis: the checks' verdicts turned into the likely cause and the next step.

The field's failures were each found by a person reading logs; the diagnosis says what such a
person would have concluded, in one line per finding:

| the checks found | the likely cause |
|---|---|
| identity: another speculative setup | the unit runs another command line than the profile's |
| identity: another engine or version | the wrong image; nothing else can be trusted |
| lossless failed | the verifier accepts drafts the target would not choose: the engine's speculative path is broken |
| prefix_cache failed | cache hits serve other blocks than a fresh prefill computes (vllm#43559, #53912) |
| accuracy below its floor, text clean | chat template, tokenizer, weights or config: the target answers wrong |
| coherence failed | the target itself is broken (engine version, kernels, weights) |
| concurrency failed, coherence passed | batched kernels or too many draft tokens |
| acceptance below the band, position 0 low | the drafter proposes wrong tokens: its config (verify-config) |
| acceptance above the band with repetitive text | a token loop in the target |
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdeploy.core.verdicts import Verdict
from specdeploy.smoke import acceptance
from specdeploy.smoke.checks.identity import NEXTN_DRAFT_PATH

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke


def _failed(smoke: Smoke, name: str) -> bool:
    stage = smoke.report.stage(name)
    return stage is not None and stage.status is Verdict.failed


def _reach(smoke: Smoke) -> list[str]:
    report = smoke.report
    ready = report.stage("readiness")
    unexpected = [s for s in report.stages if s.status is Verdict.error and s.summary.startswith("could not test:")]
    out = []
    if smoke.endpoint_problem:
        out.append(f"endpoint: {report.endpoint!r} is not an engine's base URL: nothing was asked of it")
    elif unexpected:
        out.append(
            f"unexpected answer at {unexpected[0].name}: whatever answers at {report.endpoint} does not speak the "
            "engine's API as the profile pins it — check the endpoint (base URL, no proxy page) and the engine"
        )
    elif ready and ready.status is Verdict.error:
        out.append(
            "unreachable: the server is down, still loading, or serves another model name — "
            "check the service and its log"
        )
    if report.stage("server") is not None:
        out.append(
            "the server failed mid-run (connection lost or HTTP 5xx): read the engine log; "
            "the results above are partial"
        )
    return out


def _identity(smoke: Smoke) -> list[str]:
    ident = smoke.report.stage("identity")
    if ident is None or ident.status is not Verdict.failed:
        return []
    mismatch = ident.details.get("mismatch")
    if mismatch in ("speculation", "context length"):
        what = "speculative setup" if mismatch == "speculation" else "context length"
        return [
            f"{what}: {ident.summary} — the engine runs another command line than the profile's: reinstall "
            "the unit from the profile (`specdeploy unit render` shows the command) and restart it"
        ]
    if mismatch == "default sampling":
        return [
            "default sampling: clients that set no temperature get sampled text — the model's generation_config.json "
            "changed, or the engine reads another one; serve the verified revision (or --generation-config vllm)"
        ]
    return [
        "engine identity: the endpoint runs a different engine/version than the profile pins — "
        "rebuild or pull the pinned image (specdeploy image check) before trusting any other result"
    ]


def _content(smoke: Smoke) -> list[str]:
    out = []
    coherent = not _failed(smoke, "coherence")
    if _failed(smoke, "lossless"):
        out.append(
            "lossless: speculative decoding emitted tokens the target would not have chosen — the verifier "
            "(rejection sampler) or the drafts' bookkeeping is broken in this engine build: do not serve it"
        )
    if _failed(smoke, "prefix_cache"):
        out.append(
            "prefix cache: answers served from cached blocks differ from a fresh prefill — turn prefix caching off "
            "(engine.serve.enable_prefix_caching: false) or move to an engine with the fix (vllm#43559, #53912)"
        )
    if _failed(smoke, "accuracy") and coherent:
        out.append(
            "accuracy below the floor while the text reads fine: the target answers wrong — a chat template, "
            "tokenizer, config or weights that are not the verified ones (compare the served files with the lock)"
        )
    conc = smoke.report.stage("concurrency")
    if conc and conc.status is Verdict.failed and coherent:
        out.append(
            f"corrupt under concurrency: answers right one at a time but not with {conc.details.get('concurrency')} "
            "in flight — suspect the engine's batched kernels or too many draft tokens (the field's drafter at 15 "
            "tokens: 32/32 at concurrency 1, 11/32 at 4); do not serve it"
        )
    elif conc and conc.status is Verdict.inconclusive:
        out.append(
            "concurrent outputs differ from the sequential ones beyond the reported floor, while right and clean: "
            "batching numerics, or a corruption starting — run the gate again and compare with the golden"
        )
    longc = smoke.report.stage("long_context")
    if longc and longc.status is Verdict.failed:
        out.append(
            f"long context: acceptance collapsed after position {longc.details.get('position')} "
            "(vllm-project/vllm#52873 saw 0% engine-wide past 32768) — the engine version is suspect"
        )
    thr = smoke.report.stage("throughput")
    if thr and thr.status is Verdict.inconclusive:
        out.append(f"throughput not measured: {thr.summary}; the profile's floor was not checked")
    return out


def _acceptance(smoke: Smoke) -> list[str]:
    acc, est = smoke.report.stage("acceptance"), smoke.acceptance_estimate
    incoherent = _failed(smoke, "coherence")
    out = []
    loop = bool(acc and acc.details.get("token_loop"))
    if loop:
        out.append(
            "token loop: every draft position accepted ~100% while the text repeats — the target is "
            "degenerate (engine version, kernels or weights), not the drafter"
        )
    elif incoherent and acc is not None and acc.status is Verdict.passed:
        out.append(
            "acceptance fine but output incoherent: suspect the engine version or its kernels "
            "(known-bad versions, attention backend), not the drafter"
        )
    elif incoherent:
        out.append(
            "output incoherent: the target itself is broken (engine version, kernels, target weights or "
            "revision); a broken target also rejects drafts, so fix this before judging acceptance"
        )
    measured = acc is not None and acc.status not in (Verdict.passed, Verdict.skipped) and est is not None
    if not measured or est is None or loop:
        return out
    profile, decision = smoke.profile, acc.details.get("decision")
    if est.drafts == 0 or (est.mean_acceptance_length <= acceptance.INACTIVE and not est.per_position):
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
    return out


def diagnose(smoke: Smoke) -> list[str]:
    """Turn stage results into the likely cause and the next step."""
    out = _reach(smoke) + _identity(smoke) + _content(smoke) + _acceptance(smoke)
    if _failed(smoke, "golden"):
        out.append(
            "golden drift: greedy outputs changed since the golden transcript was recorded — the served "
            "model, its revision or the engine differs from the verified deploy"
        )
    acc, thr = smoke.report.stage("acceptance"), smoke.report.stage("throughput")
    if thr and thr.status is Verdict.failed and acc and acc.status is Verdict.passed:
        out.append(
            "good acceptance but low tok/s: too many draft tokens for what is accepted — lower "
            "num_speculative_tokens (the field tuned 15 -> 5)"
        )
    return out
