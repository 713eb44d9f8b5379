"""Load deployment profiles by name or path, with errors that name the file and the field.

A profile is a YAML file (`profiles/*.yaml`, shipped inside the wheel too). Ansible, the
Containerfiles and this package all read it, so a value (a commit, a flag, a threshold) is
written once; a profile holding something that looks like a hub token is refused, because
profiles are committed.

The YAML is read strictly (failures found by trying bad input): a key written twice in one
mapping (`num_speculative_tokens: 5`, later `: 15`) silently loaded as the last value, so it
is refused naming both lines; an alias bomb (aliases of aliases, a billion values from a
few hundred bytes) spun forever and a self-referencing alias ended in a traceback, so the
document's size with every alias expanded, its depth and its cycles are checked before
anything is built from it; tags outside plain JSON-like data (`!!binary`, `!!set`,
timestamps) are refused or read as text, because a profile is printed as JSON. The file
itself is read through `core.files`: a regular file, at most 1 MiB, UTF-8.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specdeploy.core import files
from specdeploy.core.errors import ProfileError
from specdeploy.profile.schema import Profile

SCHEMA_VERSION = 1
# A Hugging Face user access token. Profiles are committed: one must never hold a secret.
_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{30,}")

# Bounds of a profile document (a real one: ~600 values, nested 8 deep, no aliases needed).
MAX_VALUES = 100_000  # every alias expanded: an alias bomb stops here, in milliseconds
MAX_DEPTH = 64
_TAG = "tag:yaml.org,2002:"
# JSON-like data only: what a profile holds, and what `profile show --json` can print
_ALLOWED_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_BASE_LOADER):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader (libyaml when present), refusing duplicate keys, reading
    timestamps as text, and turning a scalar that cannot be converted (`0x_`) into a YAML
    error with its position instead of a ValueError."""

    origin = "profile"
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TAG + "timestamp"]
        for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
    }

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {_short(node.value)} as {node.tag.removeprefix(_TAG)}: {exc}", node.start_mark
            ) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                first_key, first_value = seen[key]
                raise ProfileError(
                    f"{self.origin}: key {_short(key)} appears twice in one mapping: {_where(first_key, key_node)} "
                    f"({_node_text(first_value)}) and {_where(key_node, first_key)} ({_node_text(value_node)}); "
                    "YAML would silently keep only the last one, so the profile is refused",
                    hint=f"keep one {key}: line in that mapping (the value you mean) and delete the other",
                )
            seen[key] = (key_node, value_node)
        return super().construct_mapping(node, deep=deep)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'"


def _where(node: Any, other: Any) -> str:
    """`line L` of a node (with its column when `other` is on the same line)."""
    mark, other_mark = node.start_mark, other.start_mark
    column = f", column {mark.column + 1}" if mark.line == other_mark.line else ""
    return f"line {mark.line + 1}{column}"


def _node_text(node: Any) -> str:
    if isinstance(node, yaml.ScalarNode):
        return _short(node.value)
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    return []


def _check_graph(root: Any, origin: str) -> None:
    """Refuse, before anything is built, a document whose value count with every alias
    expanded, or whose depth, is beyond any profile's, or that refers to itself. One pass
    over the composed nodes (shared nodes counted once per use, computed once)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    reused = 0  # values used again through an alias
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_nodes.discard(key)
            mark = f"line {node.start_mark.line + 1}"
            if size[key] > MAX_VALUES:
                via = f" through aliases ({reused} seen so far)" if reused else ""
                raise ProfileError(
                    f"{origin}: the YAML expands to more than {MAX_VALUES} values{via} (from {mark}); "
                    "a profile holds a few hundred, so it was not read further",
                    hint="write the values out instead of nesting aliases of aliases; "
                    "check that this is the right file",
                )
            if depth[key] > MAX_DEPTH:
                raise ProfileError(
                    f"{origin}: the YAML is nested more than {MAX_DEPTH} levels deep (at {mark}); "
                    "a profile is nested about 8, so it was not read further",
                    hint="check that this is the right file",
                )
            continue
        if key in size:
            reused += 1
            continue
        if key in open_nodes:
            raise ProfileError(
                f"{origin}: an alias at or below line {node.start_mark.line + 1} refers to the value that contains "
                "it: the document would be infinite",
                hint="replace the alias (*name) by the values it should hold",
            )
        if node.tag not in _ALLOWED_TAGS:
            raise ProfileError(
                f"{origin}: line {node.start_mark.line + 1}: tag {node.tag} is not allowed in a profile "
                "(expected plain strings, numbers, booleans, null, lists and mappings)",
                hint="remove the tag and write the value as plain text (quoted if needed)",
            )
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))


def parse_yaml(text: str, origin: str) -> Any:
    """`text` as the data of one strict YAML document, or a ProfileError naming `origin`, the
    line and column, and what to fix. Only plain data comes back (dict, list, str, int,
    float, bool, None)."""
    loader = _StrictLoader(text)
    loader.origin = origin
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_graph(node, origin)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        where = ""
        if exc.problem_mark is not None:
            where = f" at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise ProfileError(
            f"{origin}: not valid YAML{where}: {what or exc}",
            hint="fix the YAML at that line (indentation, an unclosed bracket or quote; "
            "quote a string that holds ': ' or ' #')",
        ) from None
    except yaml.YAMLError as exc:
        raise ProfileError(
            f"{origin}: not valid YAML: {' '.join(str(exc).split())}", hint="fix the YAML (or restore the file)"
        ) from None
    except RecursionError:
        raise ProfileError(
            f"{origin}: the YAML is nested too deeply to be a profile", hint="check that this is the right file"
        ) from None


def profile_dirs() -> list[Path]:
    """Where named profiles are looked up, first match wins.

    `$SPECDEPLOY_PROFILES` (os.pathsep-separated) first, then the copy shipped inside the
    wheel, then the repository's `profiles/` for editable installs and checkouts.
    """
    dirs = [Path(p) for p in os.environ.get("SPECDEPLOY_PROFILES", "").split(os.pathsep) if p]
    package = Path(__file__).resolve().parents[1]  # .../specdeploy
    dirs += [package / "profiles", package.parents[1] / "profiles"]
    return [d for d in dirs if _is_dir(d)]


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def list_profiles() -> dict[str, Path]:
    """Every `*.yaml` in the profile directories by name (first directory wins). Entries that
    are not files (a directory named `x.yaml`) are listed too: loading them says what they are."""
    found: dict[str, Path] = {}
    for directory in profile_dirs():
        try:
            entries = sorted(directory.glob("*.yaml"))
        except OSError:
            continue
        for path in entries:
            found.setdefault(path.stem, path)
    return found


def _names_a_file(text: str) -> bool:
    """Whether `--profile TEXT` means a path: a .yaml/.yml name, a path with a separator, or an
    existing entry that is not a directory (a directory of that name does not hide a profile)."""
    if Path(text).suffix in (".yaml", ".yml") or os.sep in text or (os.altsep and os.altsep in text):
        return True
    try:
        return os.path.lexists(text) and not os.path.isdir(text)
    except (OSError, ValueError):
        return False


def resolve_profile_path(name_or_path: str | os.PathLike[str]) -> Path:
    """The file a `--profile` value names: a path as given (it is checked when read), or a
    profile name looked up in `profile_dirs()`."""
    text = os.fspath(name_or_path)
    if not text.strip():
        raise ProfileError(
            "the profile is empty: expected a profile name or the path of a .yaml file, found ''",
            hint="pass --profile NAME (see `specdeploy profile list`) or --profile path/to/NAME.yaml",
        )
    if "\0" in text:
        raise ProfileError(
            f"profile {text!r}: a name or path cannot hold a NUL character", hint="pass the profile's name or path"
        )
    if _names_a_file(text):
        return Path(text)
    known = list_profiles()
    if text not in known:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ProfileError(
            f"no profile named {shown!r}",
            hint=f"known profiles: {', '.join(sorted(known)) or 'none'} "
            f"(searched {', '.join(str(d) for d in profile_dirs())}); or pass a path to a .yaml file",
        )
    return known[text]


def parse_profile(data: Any, origin: str) -> Profile:
    """Validate a profile document, turning pydantic's errors into one readable message."""
    if not isinstance(data, dict):
        found = "nothing (the file is empty)" if data is None else f"a {type(data).__name__} ({_short(data)})"
        raise ProfileError(
            f"{origin}: expected a YAML mapping at the top level (schema_version, name, engine, ...), found {found}",
            hint="start from a committed profile (`specdeploy profile list`) and edit it",
        )
    found_version = data.get("schema_version")
    if type(found_version) is not int or found_version != SCHEMA_VERSION:
        raise ProfileError(
            f"{origin}: field schema_version: expected {SCHEMA_VERSION}, found {_short(found_version)}",
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
        errors = exc.errors()
        for err in errors[:20]:
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            found = err.get("input")
            found_text = "" if isinstance(found, dict) else f" (found {_short(found)})"
            lines.append(f"  field {field}: {err['msg']}{found_text}")
        if len(errors) > 20:
            lines.append(f"  ... and {len(errors) - 20} more")
        raise ProfileError(
            f"{origin}: invalid profile\n" + "\n".join(lines),
            hint="correct the field(s) named above (the schema is python/specdeploy/profile/schema.py)",
        ) from None


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


def read_profile_data(path: Path) -> Any:
    """The data of the profile file at `path`: a regular file of at most 1 MiB, UTF-8, one
    strict YAML document."""
    data = files.read_bytes(
        path,
        what="profile",
        limit=files.LIMITS["yaml"],
        hint="pass the path of a profile .yaml file, or a profile name (see `specdeploy profile list`)",
    )
    return parse_yaml(files.decode(data, path, what="profile"), str(path))


# What a site's override file may change, by dotted field name: the draft length a site tunes for its
# own hosts (`specdeploy tune --apply` writes it) and the acceptance bands that move with it (bench.tune
# derives them from the profile's own and the measured acceptance); never a pin, a path or another check.
TUNABLE = (
    "engine.speculative.num_speculative_tokens",
    "smoke.acceptance_length.min",
    "smoke.acceptance_length.max",
    "smoke.acceptance_length.source",
    "watch.acceptance_length_min",
)
OVERRIDE_KEYS = {"schema_version", "extends", "overrides", "note"}
OVERRIDE_HINT = (
    "a site override holds schema_version: 1, extends: <a shipped profile's name>, overrides: {field: value} "
    f"with fields among {', '.join(TUNABLE)}, and an optional note (`specdeploy tune --apply` writes one)"
)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat |= _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return flat


def is_override(data: Any) -> bool:
    return isinstance(data, dict) and "extends" in data


def apply_override(data: dict[str, Any], path: Path) -> Profile:
    """A site's override file resolved: its base, a shipped profile (never another override, never the
    file itself), with the tunable values it sets. The result keeps the base's name, so the site's
    lock entries (revisions, hashes) stay the base's; its `site_override` says what changed."""
    origin = str(path)
    extra = sorted(set(data) - OVERRIDE_KEYS)
    if extra:
        raise ProfileError(f"{origin}: field {extra[0]}: not part of a site override", hint=OVERRIDE_HINT)
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(
            f"{origin}: field schema_version: expected {SCHEMA_VERSION}, found {_short(data.get('schema_version'))}",
            hint=OVERRIDE_HINT,
        )
    base_name = data.get("extends")
    if not isinstance(base_name, str) or base_name != path.stem:
        raise ProfileError(
            f"{origin}: field extends: expected {path.stem!r} (the file's name: the site's file stands in for "
            f"that profile), found {_short(base_name)}",
            hint=OVERRIDE_HINT,
        )
    overrides = data.get("overrides")
    if not isinstance(overrides, dict) or not overrides:
        raise ProfileError(f"{origin}: field overrides: expected a mapping of values, found {_short(overrides)}",
                           hint=OVERRIDE_HINT)  # fmt: skip
    flat = _flatten(overrides)
    for field in flat:
        if field not in TUNABLE:
            raise ProfileError(
                f"{origin}: field overrides.{field}: a site override may set only {', '.join(TUNABLE)}",
                hint="change anything else in the profile itself (reviewed and committed), not per site",
            )
    note = data.get("note")
    if note is not None and not isinstance(note, str):
        raise ProfileError(f"{origin}: field note: expected text, found {_short(note)}", hint=OVERRIDE_HINT)
    here = path.resolve()
    bases = [d / f"{base_name}.yaml" for d in profile_dirs()]
    base_path = next((b for b in bases if b.resolve() != here and os.path.lexists(b)), None)
    if base_path is None:
        raise ProfileError(
            f"{origin}: field extends: no shipped profile named {base_name!r} (searched "
            f"{', '.join(str(d) for d in profile_dirs())})",
            hint="name a profile of `specdeploy profile list`",
        )
    base = read_profile_data(base_path)
    if is_override(base):
        raise ProfileError(f"{origin}: field extends: {base_path} is itself a site override", hint=OVERRIDE_HINT)
    merged = copy.deepcopy(base)
    for field, value in flat.items():
        *parents, leaf = field.split(".")
        node = merged
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    merged["site_override"] = {"file": origin, "overrides": flat, "note": note}
    return parse_profile(merged, f"{origin} (extending {base_path})")


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    path = resolve_profile_path(name_or_path)
    data = read_profile_data(path)
    if is_override(data):
        return apply_override(data, path)
    profile = parse_profile(data, str(path))
    if profile.name != path.stem:
        raise ProfileError(
            f"{path}: field name: expected {path.stem!r} (the file name), found {profile.name!r}",
            hint="a profile's name and file name must agree so that `--profile NAME` is unambiguous",
        )
    return profile
