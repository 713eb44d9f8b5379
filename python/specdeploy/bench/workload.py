"""A benchmark workload and its identity.

Failure prevented: two stacks compared on different prompts, lengths, levels of concurrency,
temperatures or models (the field compared DFlash with MTP across tools and days). A workload's
`key` is the hash of everything that decides the work asked of an engine; `bench compare` merges
only reports of one key and names the fields that differ otherwise.

A workload file is YAML: `name`, `prompts` (chat messages' text, at least one), and optionally
`output_tokens`, `requests_per_level`, `concurrency`, `temperature` (the profile's `bench`
section gives what it leaves out). Without a file, the profile's free-form and acceptance prompts
are the workload (`from_profile`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specdeploy.core import files
from specdeploy.core.errors import InputFileError, first_invalid
from specdeploy.profile import Profile

MAX_PROMPTS = 10000
MAX_PROMPT_CHARS = 200_000
MAX_FILE_BYTES = 16 * 1024 * 1024


class Workload(BaseModel):
    """What every stack is asked, identically."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    prompts: tuple[str, ...] = Field(min_length=1, max_length=MAX_PROMPTS)
    output_tokens: int = Field(ge=8, le=8192)
    requests_per_level: int = Field(ge=1, le=10000)
    concurrency: tuple[int, ...] = Field(min_length=1)
    temperature: float = Field(ge=0, le=2)
    served_model: str = Field(min_length=1)

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, prompts: tuple[str, ...]) -> tuple[str, ...]:
        for i, p in enumerate(prompts):
            if not p.strip() or len(p) > MAX_PROMPT_CHARS or "\x00" in p:
                raise ValueError(f"prompt {i}: expected non-empty text of at most {MAX_PROMPT_CHARS} characters")
        return prompts

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if any(c < 1 for c in levels) or list(levels) != sorted(set(levels)):
            raise ValueError(f"expected distinct levels >= 1 in rising order, found {list(levels)}")
        return levels

    @property
    def prompts_sha256(self) -> str:
        return hashlib.sha256(json.dumps(list(self.prompts), ensure_ascii=False).encode()).hexdigest()

    def identity(self) -> dict[str, Any]:
        """The fields two comparable runs share, the prompt set by its hash."""
        return {
            "prompts_sha256": self.prompts_sha256,
            "prompts": len(self.prompts),
            "output_tokens": self.output_tokens,
            "requests_per_level": self.requests_per_level,
            "concurrency": list(self.concurrency),
            "temperature": self.temperature,
            "served_model": self.served_model,
        }

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:16]

    def requests_at(self, concurrency: int) -> int:
        """Requests sent at one level: the workload's count, at least twice the level (a full batch twice)."""
        return max(self.requests_per_level, 2 * concurrency)


def levels(profile: Profile) -> tuple[int, ...]:
    """The profile's levels of concurrency: its `bench.concurrency`, else 1 and smoke.concurrency."""
    return tuple(profile.bench.concurrency) or tuple(sorted({1, profile.smoke.concurrency}))


def from_profile(profile: Profile) -> Workload:
    """The profile's own workload: its free-form and acceptance prompts, its `bench` settings."""
    prompts = tuple(profile.smoke.prompts.free_form) + tuple(profile.smoke.prompts.acceptance)
    return _build(profile, {"name": f"{profile.name}-prompts"[:64], "prompts": list(prompts)}, "the profile")


def load(path: Path, profile: Profile) -> Workload:
    """A workload file (module docstring), its omitted settings from `profile`."""
    text = files.read_text(path, what="workload file", limit=MAX_FILE_BYTES)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputFileError(f"workload file {path}: not YAML ({exc})", hint="fix the file's syntax") from None
    if not isinstance(data, dict):
        raise InputFileError(
            f"workload file {path}: expected a mapping with name and prompts, found {type(data).__name__}",
            hint="see specdeploy/bench/workload.py's docstring for the format",
        )
    return _build(profile, data, f"workload file {path}")


def _build(profile: Profile, data: dict[str, Any], what: str) -> Workload:
    fields = {
        "output_tokens": profile.bench.output_tokens,
        "requests_per_level": profile.bench.requests_per_level,
        "concurrency": levels(profile),
        "temperature": profile.bench.temperature,
        "served_model": profile.engine.serve.served_model_name,
        **data,
    }
    try:
        return Workload.model_validate(fields)
    except ValidationError as exc:
        raise InputFileError(
            f"{what}: field {first_invalid(exc)}",
            hint="a workload needs name (lowercase, dashes) and prompts; the rest defaults to the profile's "
            "bench section",
        ) from None
