"""The front's one model: the profile's `front:` section (listen address, certificate, allow-list,
timeouts, runtime socket) plus the backends — the engine hosts, which are not the profile's: the
inventory names them, a migration changes their states.

`FrontConfig` is what `haproxy.render` renders and what the runtime API and the balancers name
servers by; `parse_backend` reads the CLI's `--backend name=address:port[@state]`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specdeploy.core.errors import UsageError
from specdeploy.profile.schema import FrontSpec, Profile

BACKEND = "engines"  # the HAProxy backend (proxy) holding the engine hosts
FRONTEND = "front"  # the HAProxy frontend listening for clients
STATES = ("ready", "drain", "maint")
# A server's weight when it takes traffic; a server rendered in `drain` gets weight 0 (HAProxy has no
# configuration keyword for the drain state) and `ready` through the runtime API sets this back.
WEIGHT = 100
# Each engine host is also rendered as a backup server of this name (`NAME--backup`), in maint: after a
# cutover OLD's twin is put in (ready), so that HAProxy sends OLD every request while NEW is down, until
# `migrate finish` takes it out (docs/front.md, "OLD kept as the way back").
BACKUP_SUFFIX = "--backup"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
State = Literal["ready", "drain", "maint"]


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Backend(BaseModel):
    """One engine host behind the front: its server name (what the runtime API and a hook are
    told, and the name its listener's certificate must carry), the internal address and port its
    listener serves the front on, its state — `ready` (takes requests), `drain` (finishes what it
    has, takes nothing new) or `maint` (out) — and whether the hop is over mutual TLS (always,
    unless the engine is on the front host's own loopback)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    address: str
    port: int = Field(ge=1, le=65535)
    state: State = "ready"
    # the hop over mutual TLS to the engine host's listener (docs/front.md): always across a network; plain
    # HTTP only to an engine on the front host's own loopback (the default there)
    tls: bool = True

    @model_validator(mode="before")
    @classmethod
    def _tls_by_default_across_a_network(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tls" not in data and isinstance(data.get("address"), str):
            return data | {"tls": not _is_loopback(data["address"])}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                "backend name: expected letters, digits, '.', '-' or '_' (at most 63, a letter or digit first), "
                f"found {v!r}"
            )
        if v.endswith(BACKUP_SUFFIX):
            raise ValueError(
                f"backend name: expected a name not ending in {BACKUP_SUFFIX!r} (each host's backup server is named "
                f"so), found {v!r}"
            )
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            if not _HOSTNAME_RE.match(v):
                raise ValueError(f"backend address: expected an IP address or a host name, found {v!r}") from None
        return v

    @property
    def loopback(self) -> bool:
        """An address of the front host itself (127.0.0.0/8, ::1, localhost): the hop crosses no network."""
        return _is_loopback(self.address)

    @model_validator(mode="after")
    def _tls_across_a_network(self) -> Backend:
        if not self.tls and not self.loopback:
            raise ValueError(
                f"backend {self.name}: expected TLS to an engine host at {self.address} (not the front's loopback), "
                "found plain HTTP: the API key, prompts and answers would cross the network in clear"
            )
        return self

    @property
    def ipv6(self) -> bool:
        try:
            return ipaddress.ip_address(self.address).version == 6
        except ValueError:
            return False

    @property
    def endpoint(self) -> str:
        return f"[{self.address}]:{self.port}" if self.ipv6 else f"{self.address}:{self.port}"


class FrontConfig(FrontSpec):
    """The whole front: the profile's `front:` settings and the backends behind it."""

    backends: list[Backend] = Field(min_length=1, description="the engine hosts, at least one")
    profile: str | None = Field(None, description="the profile it was rendered from (a comment in haproxy.cfg)")

    @model_validator(mode="after")
    def _unique_backends(self) -> FrontConfig:
        names = [b.name for b in self.backends]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"backends: expected each server name once, found {repeated} more than once")
        endpoints = [b.endpoint for b in self.backends]
        repeated = sorted({e for e in endpoints if endpoints.count(e) > 1})
        if repeated:
            raise ValueError(f"backends: expected each address:port once, found {repeated} more than once")
        return self

    @classmethod
    def of(cls, spec: FrontSpec, backends: list[Backend], **overrides: Any) -> FrontConfig:
        """The front of a profile's `front:` settings, these backends and any field overridden
        (`cert_path`, `log`, ...); a bad value is a UsageError naming the field, expected and found."""
        data = spec.model_dump() | {"backends": backends} | overrides
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UsageError(
                "the front's settings are not usable:\n" + "\n".join(_lines(exc)),
                hint="correct the option or the profile's front: section named above (docs/front.md)",
            ) from None

    @classmethod
    def from_profile(cls, profile: Profile, backends: list[Backend], **overrides: Any) -> FrontConfig:
        return cls.of(profile.front, backends, profile=profile.name, **overrides)


def _lines(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  field {field}: {err['msg'].removeprefix('Value error, ')}")
    return lines


_BACKEND_RE = re.compile(
    r"^(?P<name>[^=]+)=(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:@\[\]]+)):(?P<port>[0-9]{1,5})(?:@(?P<state>\w+))?$"
)


def backup_name(server: str) -> str:
    """The name of `server`'s backup twin in the front (in maint unless a cutover put it in)."""
    return f"{server}{BACKUP_SUFFIX}"


def parse_backend(text: str) -> Backend:
    """`name=address:port[@state]` (an IPv6 address in brackets: `new=[fd00::2]:8000@maint`)."""
    match = _BACKEND_RE.match(text.strip())
    if not match:
        raise UsageError(
            f"--backend: expected NAME=ADDRESS:PORT[@ready|drain|maint], found {text!r}",
            hint="e.g. --backend old=10.0.0.11:8000 --backend new=10.0.0.12:8000@maint (IPv6: new=[fd00::12]:8000)",
        )
    state = match.group("state") or "ready"
    if state not in STATES:
        raise UsageError(
            f"--backend {text}: expected a state of {list(STATES)} after @, found {state!r}",
            hint="ready takes requests, drain finishes what it has, maint is out",
        )
    try:
        address = match.group("v6") or match.group("host")
        return Backend(
            name=match.group("name"),
            address=address,
            port=int(match.group("port")),
            state=state,  # type: ignore[arg-type]
        )
    except ValidationError as exc:
        raise UsageError(
            f"--backend {text}: " + "; ".join(line.strip() for line in _lines(exc)),
            hint="NAME: letters, digits, '.', '-', '_'; ADDRESS: an IP address or host name; PORT: 1-65535",
        ) from None
