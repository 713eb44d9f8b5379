"""Identity: the endpoint serves the profile's engine, at its pinned version, with its speculative
setup, its context length and its default sampling.

| compared | from | a mismatch means |
|---|---|---|
| engine, version | /version (vLLM), /server_info (SGLang) | another build than the pinned one, or a known-bad one |
| method, k | vLLM: /metrics (k), startup log (method); SGLang: server info | speculation off, another method or k |
| context length | /v1/models' max_model_len | a truncated --max-model-len: longer prompts are refused |
| default sampling | the startup log (vLLM logs generation config overrides) | clients that set nothing get its values |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.engine import startup_log
from specdeploy.images.guards import same_release
from specdeploy.profile import Profile

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "identity"
# Method names an engine reports for a profile's method: SGLang turns NEXTN into EAGLE when it parses
# its arguments (sglang/srt/server_args.py), so a NEXTN profile is served as "EAGLE".
SERVED_METHOD = {"NEXTN": "EAGLE"}
NEXTN_DRAFT_PATH = "sgl-project/sglang#23859"


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


def served_speculation(smoke: Smoke) -> dict[str, Any]:
    """What the server speculates with, merged from its API (k; SGLang: the method and the draft
    path too) and, where the gate gave it, the startup log (vLLM's method)."""
    api = smoke.client.served_speculation()
    merged = {"method": api.method, "k": api.k, "draft_model_path": api.draft_model_path, "sources": [api.source]}
    if smoke.options.startup_log is not None:
        logged = startup_log.served_speculation(smoke.options.startup_log())
        if logged is None:
            merged["sources"].append("the startup log: no speculative_config line (method not checked)")
        else:
            merged["sources"].append(logged.source)
            merged["method"] = logged.method
            if merged["k"] is None or logged.k == 0:
                merged["k"] = logged.k
    return merged


def _context_mismatch(smoke: Smoke, details: dict[str, Any]) -> str | None:
    want = smoke.profile.engine.serve.max_model_len
    served = smoke.client.served_max_model_len()
    details["max_model_len"] = served
    if want is None or served is None or served == want:
        return None
    if served < want:
        why = f"a truncated --max-model-len: prompts past {served} tokens are refused"
    else:
        why = "a longer --max-model-len than the verified one"
    return f"served context length (max_model_len) {served}, the profile pins {want}: {why}"


def _sampling_mismatch(smoke: Smoke, details: dict[str, Any]) -> str | None:
    """Where the profile expects the engine's own default sampling parameters, a startup log that says a
    generation config overrode them (vLLM logs the values): clients that set no temperature, top_p or
    repetition penalty get the file's, and penalties apply to greedy requests too."""
    if smoke.spec.default_sampling != "engine":
        details["default_sampling"] = "not checked (the model's generation config decides)"
        return None
    if smoke.options.startup_log is None:
        details["default_sampling"] = "not checked (no startup log)"
        return None
    overridden = startup_log.served_sampling_overrides(smoke.options.startup_log())
    details["default_sampling"] = overridden or "the engine's own"
    if overridden is None:
        return None
    return (
        f"the engine's default sampling parameters were overridden by {overridden} (its startup log), where the "
        "profile expects the engine's own: requests that set none are sampled or penalised by them"
    )


def check(smoke: Smoke) -> Stage:
    ident = smoke.client.identity()
    profile = smoke.profile
    pinned = profile.engine.source.version
    details: dict[str, Any] = {"engine": ident.kind, "version": ident.version, "profile_version": pinned.value}
    if ident.kind != profile.engine.kind:
        return Stage(NAME, Verdict.failed, f"the server is {ident.kind}, the profile is {profile.engine.kind}", details)
    bad = profile.engine.known_bad_entry(version=ident.version)
    if bad is not None:
        return Stage(NAME, Verdict.failed, f"{ident.kind} {ident.version} is {bad.describe()}", details)
    if pinned.resolved and not same_release(ident.version, str(pinned.value)):  # 0.29.0+cu129 is 0.29.0
        return Stage(
            NAME,
            Verdict.failed,
            f"{ident.kind} version {ident.version}, profile pins {pinned.value} ({pinned.provenance})",
            details,
        )
    served = served_speculation(smoke)
    details["speculation"] = served
    smoke.served_k = served["k"]
    if problem := speculation_mismatch(profile, served):
        details["mismatch"] = "speculation"
        return Stage(NAME, Verdict.failed, problem, details)
    if problem := _context_mismatch(smoke, details):
        details["mismatch"] = "context length"
        return Stage(NAME, Verdict.failed, problem, details)
    if problem := _sampling_mismatch(smoke, details):
        details["mismatch"] = "default sampling"
        return Stage(NAME, Verdict.failed, problem, details)
    setup = f"{served['method'] or profile.engine.speculative.method} k={served['k']}"
    context = f", context {details['max_model_len']}" if details.get("max_model_len") else ""
    return Stage(NAME, Verdict.passed, f"{ident.kind} {ident.version} as pinned, speculating {setup}{context}", details)
