"""Load deployment profiles by name or path, with errors that name the file and the field.

A profile is a YAML file (`profiles/*.yaml`, shipped inside the wheel too). Ansible, the
Containerfiles and this package all read it, so a value (a commit, a flag, a threshold) is
written once; a profile holding something that looks like a hub token is refused, because
profiles are committed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specdeploy.core.errors import ProfileError
from specdeploy.profile.schema import Profile

SCHEMA_VERSION = 1
# A Hugging Face user access token. Profiles are committed: one must never hold a secret.
_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{30,}")


def profile_dirs() -> list[Path]:
    """Where named profiles are looked up, first match wins.

    `$SPECDEPLOY_PROFILES` (os.pathsep-separated) first, then the copy shipped inside the
    wheel, then the repository's `profiles/` for editable installs and checkouts.
    """
    dirs = [Path(p) for p in os.environ.get("SPECDEPLOY_PROFILES", "").split(os.pathsep) if p]
    package = Path(__file__).resolve().parents[1]  # .../specdeploy
    dirs += [package / "profiles", package.parents[1] / "profiles"]
    return [d for d in dirs if d.is_dir()]


def list_profiles() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in profile_dirs():
        for path in sorted(directory.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def resolve_profile_path(name_or_path: str | os.PathLike[str]) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise ProfileError(f"profile file {candidate} does not exist")
        return candidate
    known = list_profiles()
    if str(name_or_path) not in known:
        raise ProfileError(
            f"no profile named {str(name_or_path)!r}",
            hint=f"known profiles: {', '.join(sorted(known)) or 'none'} "
            f"(searched {', '.join(str(d) for d in profile_dirs())}); or pass a path to a .yaml file",
        )
    return known[str(name_or_path)]


def parse_profile(data: Any, origin: str) -> Profile:
    """Validate a profile document, turning pydantic's errors into one readable message."""
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: expected a YAML mapping at the top level, found {type(data).__name__}")
    found_version = data.get("schema_version")
    if found_version != SCHEMA_VERSION:
        raise ProfileError(
            f"{origin}: field schema_version: expected {SCHEMA_VERSION}, found {found_version!r}",
            hint="this specdeploy reads schema version 1; upgrade specdeploy or the profile",
        )
    _refuse_secrets(data, origin)
    if "paths" in data:
        raise ProfileError(
            f"{origin}: field paths: host paths are not part of a profile (a profile describes a stack, "
            "a host keeps its data where its site wants it)",
            hint="set specdeploy_models_dir / specdeploy_serving_dir / specdeploy_state_dir / specdeploy_cache_dir "
            "for the host in the Ansible inventory, or pass --models-dir etc. to the command",
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            found = err.get("input")
            found_text = "" if isinstance(found, dict) else f" (found {found!r})"
            lines.append(f"  field {field}: {err['msg']}{found_text}")
        raise ProfileError(f"{origin}: invalid profile\n" + "\n".join(lines)) from None


def _refuse_secrets(data: Any, origin: str, path: str = "") -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            _refuse_secrets(value, origin, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _refuse_secrets(value, origin, f"{path}[{i}]")
    elif isinstance(data, str) and _HF_TOKEN_RE.search(data):
        raise ProfileError(
            f"{origin}: field {path} holds what looks like a Hugging Face token",
            hint="profiles are committed: reference secrets by name (e.g. api_key: {secret: NAME}) "
            "and keep the value in ansible-vault or the environment; revoke the exposed token",
        )


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    path = resolve_profile_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    profile = parse_profile(data, str(path))
    if profile.name != path.stem:
        raise ProfileError(
            f"{path}: field name: expected {path.stem!r} (the file name), found {profile.name!r}",
            hint="a profile's name and file name must agree so that `--profile NAME` is unambiguous",
        )
    return profile
