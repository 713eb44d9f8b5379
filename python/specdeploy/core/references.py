"""Container image references as podman reads them: which registry an image name names."""

from __future__ import annotations


def registry_of(name: str) -> str | None:
    """The registry part of an image name (`host[:port]/path`), as podman reads it; None for a
    name no registry serves (no dot, colon or `localhost` before the first `/`, or `localhost/...`)."""
    first, _, rest = name.partition("/")
    if rest and first != "localhost" and ("." in first or ":" in first):
        return first
    return None


def repository_of(name: str) -> str:
    """An image name without its registry (`localhost/` included): the path a registry keeps it under."""
    registry = registry_of(name)
    if registry is not None:
        return name[len(registry) + 1 :]
    return name.removeprefix("localhost/")


def in_registry(name: str, registry: str | None) -> str:
    """Where `name` lives in the site's `registry` (host[:port]); a name that already names a
    registry stays itself when no other is given."""
    if registry:
        return f"{registry.rstrip('/')}/{repository_of(name)}"
    return name
