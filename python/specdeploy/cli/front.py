"""`specdeploy front render|listener|status|drain|enable|disable|save-state`: the site's front door (issue 23) —
HAProxy in front of the engine hosts: its haproxy.cfg rendered from the profile's `front:`
section and the backends, and its servers driven through the runtime API (or a site's own
balancer, through its hook). docs/front.md."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core.errors import UsageError
from specdeploy.profile.schema import FrontSpec

front_app = base.group(
    "The site's front door: HAProxy in front of the engine hosts (TLS, a path allow-list, the API key passed "
    "through), its config and its servers."
)

SocketOpt = Annotated[
    Path | None,
    typer.Option(
        "--socket",
        help=f"HAProxy's runtime API socket (default {FrontSpec().runtime_socket}, the profile's front.runtime_socket "
        "default)",
    ),
]
HookOpt = Annotated[
    Path | None,
    typer.Option(
        "--hook",
        help="drive the site's own balancer through this executable instead of HAProxy (called HOOK VERB SERVER; "
        "docs/front.md)",
    ),
]
ServerArg = Annotated[str, typer.Argument(help="the server's name (as `front status` lists it)")]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait",
        help="drain, disable: wait until its in-flight requests finished; enable: until its health check is UP",
    ),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds --wait waits at most", min=0.1)]


def _balancer(socket_path: Path | None, hook: Path | None, timeout: float) -> Any:
    from specdeploy.front import balancer, runtime

    base.one_balancer(socket_path, hook, hook_flag="--hook")
    if hook is not None:
        return balancer.HookBalancer(hook, timeout_s=timeout)
    return runtime.RuntimeApi(socket_path or Path(FrontSpec().runtime_socket))


def _status_style(state: str, status: str) -> str:
    if status.startswith("UP"):
        return "green"
    if state != "ready" and status.startswith(("DRAIN", "MAINT", "drain", "maint")):
        return "yellow"
    return "bold red"


def print_servers(servers: list[dict[str, Any]], title: str) -> None:
    """One row per server: its state, health (HAProxy's status), requests in flight."""
    table = Table("server", "address", "state", "status", "in flight", "weight", "last check", title=title)
    for s in servers:
        status = output.styled(s["status"], _status_style(s["state"], s["status"]))
        table.add_row(
            *output.cells(s["name"], s["address"], s["state"], status, s["sessions"], s["weight"], s["check"])
        )
    output.out.print(table)


@front_app.command("render")
def front_render(
    profile: Annotated[str, typer.Argument(help="profile name or path to a .yaml file (its front: section)")],
    backend: Annotated[
        list[str],
        typer.Option(
            "--backend",
            help="an engine host: NAME=ADDRESS:PORT[@ready|drain|maint] (repeatable; IPv6: NAME=[ADDR]:PORT)",
        ),
    ],
    cert: Annotated[
        Path | None,
        typer.Option(
            "--cert",
            help="the site certificate: chain and private key in one PEM file (default: the profile's front.cert_path)",
        ),
    ] = None,
    engine_ca: Annotated[
        Path | None,
        typer.Option(
            "--engine-ca",
            help="the site CA the engine hosts' listeners are verified against (default: the profile's "
            "front.engine_ca_path)",
        ),
    ] = None,
    client_cert: Annotated[
        Path | None,
        typer.Option(
            "--client-cert",
            help="the front's client certificate and key, one PEM file (default: the profile's front.client_cert_path)",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--output", "-o", help="write haproxy.cfg here (atomically) instead of printing it")
    ] = None,
    socket_path: Annotated[
        Path | None,
        typer.Option("--socket", help="the runtime API socket (default: the profile's front.runtime_socket)"),
    ] = None,
    log: Annotated[
        str | None, typer.Option("--log", help="HAProxy's log target (default: the profile's front.log, /dev/log)")
    ] = None,
    validate: Annotated[
        bool, typer.Option("--validate/--no-validate", help="check the file with `haproxy -c` before writing it")
    ] = True,
    as_json: base.JsonOpt = False,
) -> None:
    """Render the front's haproxy.cfg from the profile's front: section and the engine hosts; check
    it with the real `haproxy -c` (the certificate must then exist here); print it, or write it
    atomically with -o (prints what was written, table or --json)."""
    from specdeploy.core import atomic
    from specdeploy.front import config, haproxy
    from specdeploy.profile import load_profile

    loaded = load_profile(profile)
    backends = [config.parse_backend(text) for text in backend]
    if not backends:
        raise UsageError("no --backend: expected at least one engine host", hint="--backend NAME=ADDRESS:PORT")
    overrides: dict[str, Any] = {}
    for field, value in (("cert_path", cert), ("engine_ca_path", engine_ca), ("client_cert_path", client_cert)):
        if value is not None:
            overrides[field] = str(value.absolute())
    if socket_path is not None:
        overrides["runtime_socket"] = str(socket_path.absolute())
    if log is not None:
        overrides["log"] = log
    front = config.FrontConfig.from_profile(loaded, backends, **overrides)
    text = haproxy.render(front)
    if validate:
        haproxy.check(text)
    if out is None:
        sys.stdout.write(text)
        return
    previous = out.read_bytes() if out.is_file() else None  # a FIFO or directory there: replaced or refused
    changed = previous != text.encode()
    if changed:
        atomic.write_bytes(out, text.encode(), mode=0o644)
    data = {
        "file": str(out),
        "changed": changed,
        "validated": validate,
        "profile": loaded.name,
        "listen": f"{front.listen_address}:{front.listen_port}",
        "cert": front.cert_path,
        "socket": front.runtime_socket,
        "allow_paths": front.allow_paths,
        "backends": [b.model_dump() for b in front.backends],
    }

    def table() -> None:
        rows = Table(
            "server",
            "address",
            "state",
            title=f"front {data['listen']} -> {out} ({'changed' if changed else 'unchanged'})",
        )
        for b in front.backends:
            rows.add_row(*output.cells(b.name, b.endpoint, b.state))
        output.out.print(rows)
        output.out.print(output.line("allowed paths: ", " ".join(front.allow_paths)), highlight=False)
        output.out.print(
            output.line(
                "certificate: ",
                front.cert_path,
                "; runtime API: ",
                front.runtime_socket,
                "; checked with haproxy -c: ",
                "yes" if validate else "no",
            ),  # fmt: skip
            highlight=False,
        )

    output.emit(data, as_json, table)


@front_app.command("status")
def front_status(socket_path: SocketOpt = None, hook: HookOpt = None, as_json: base.JsonOpt = False) -> None:
    """The front's servers: state (ready, drain, maint), health, requests in flight, weight."""
    balancer = _balancer(socket_path, hook, 60.0)
    servers = [s.to_json() for s in balancer.status()]
    source = f"hook {hook}" if hook is not None else f"HAProxy {balancer.socket_path}"
    data: dict[str, Any] = {"source": source, "servers": servers}
    if hook is None:  # HAProxy's own count of failed requests (a hook's balancer has its own)
        data["failures"] = balancer.failures()
    output.emit(data, as_json, lambda: print_servers(servers, source))


def _progress(server: str, left: int, elapsed: float) -> None:
    output.err.print(f"{server}: {left} request(s) in flight after {elapsed:.1f} s", highlight=False, markup=False)


def _set(verb: str, state: str, server: str, socket_path: Path | None, hook: Path | None, wait: bool, timeout: float,
         as_json: bool) -> None:  # fmt: skip
    from specdeploy.front import balancer as balancers

    target = _balancer(socket_path, hook, timeout)
    waited = None
    in_flight = before = None
    if isinstance(target, balancers.HookBalancer):  # the hook's own contract: drain returns once drained
        {"ready": target.add, "drain": target.drain, "maint": target.remove}[state](server)
        source = f"hook {hook}"
    else:
        in_flight = target.sessions(server)  # what the change catches in flight (a drain lets them finish)
        before = {s.name: s.sessions for s in target.status()}  # every server's, where the requests were
        target.set_state(server, state)
        source = f"HAProxy {target.socket_path}"
        if wait and state == "ready":
            waited = target.wait_up(server, timeout)
        elif wait:
            waited = target.wait_drained(
                server, timeout, progress=lambda left, elapsed: _progress(server, left, elapsed)
            )
    servers = [s.to_json() for s in target.status()]
    data = {"server": server, "state": state, "waited_s": round(waited, 2) if waited is not None else None,
            "in_flight_before": in_flight, "sessions_before": before, "source": source, "servers": servers}  # fmt: skip

    def show() -> None:
        print_servers(servers, source)
        after = f" (waited {waited:.1f} s)" if waited is not None else ""
        output.out.print(output.line(f"front {verb}: ", server, f" is now {state}{after}"), highlight=False)

    output.emit(data, as_json, show)


@front_app.command("drain")
def front_drain(
    server: ServerArg,
    socket_path: SocketOpt = None,
    hook: HookOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 900.0,
    as_json: base.JsonOpt = False,
) -> None:
    """Drain a server: it takes no new request, its in-flight requests finish (--wait: until they
    have; exit 1 if they have not within --timeout)."""
    _set("drain", "drain", server, socket_path, hook, wait, timeout, as_json)


@front_app.command("enable")
def front_enable(
    server: ServerArg,
    socket_path: SocketOpt = None,
    hook: HookOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 60.0,
    as_json: base.JsonOpt = False,
) -> None:
    """Put a server in (ready): it takes requests once its health check passes (--wait: until it does)."""
    _set("enable", "ready", server, socket_path, hook, wait, timeout, as_json)


@front_app.command("disable")
def front_disable(
    server: ServerArg,
    socket_path: SocketOpt = None,
    hook: HookOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 900.0,
    as_json: base.JsonOpt = False,
) -> None:
    """Take a server out (maint): nothing new reaches it (--wait: until what it had finished). Drain
    it first to let its requests finish."""
    _set("disable", "maint", server, socket_path, hook, wait, timeout, as_json)


@front_app.command("save-state")
def front_save_state(
    state_file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help=f"where to write the states (default {FrontSpec().server_state_file}, the profile's "
            "front.server_state_file default: what haproxy.cfg's server-state-file reads at start)",
        ),
    ] = None,
    socket_path: SocketOpt = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Save every server's state (drain, maint, weight) from the running HAProxy where its next start
    reads them back (server-state-file): the front's service runs this before each reload and stop,
    so a reload never puts a drained host back in service."""
    from specdeploy.front import runtime

    api = runtime.RuntimeApi(socket_path or Path(FrontSpec().runtime_socket))
    target = state_file or Path(FrontSpec().server_state_file)
    # every backend's servers, whatever the running file holds: a HAProxy still on Debian's own config
    # (the front's first reload) has no `engines` backend, and its save is an empty list, not an error
    saved = api.save_state(target)
    data = {"file": str(target), "servers_saved": saved, "socket": str(api.socket_path)}

    def show() -> None:
        output.out.print(output.line("front save-state: ", f"{saved} server(s) saved to ", str(target)))

    output.emit(data, as_json, show)


def register(app: typer.Typer) -> None:
    app.add_typer(front_app, name="front")


@front_app.command("listener")
def front_listener(
    profile: Annotated[
        str, typer.Argument(help="profile name or path to a .yaml file (its front: and serve: sections)")
    ],
    address: Annotated[
        str,
        typer.Option(
            "--address", help="the engine host's internal address, where the front reaches it (specdeploy_publish_host)"
        ),
    ] = "",
    unit: Annotated[
        bool, typer.Option("--unit", help="print the listener's systemd unit instead of its haproxy.cfg")
    ] = False,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate/--no-validate",
            help="check the file with `haproxy -c` (the certificates must then exist here)",
        ),
    ] = False,
) -> None:
    """Print the engine host's listener: the haproxy.cfg that takes the internal address and the engine's
    port over mutual TLS (the front's certificate alone) and passes to the engine on loopback, or with
    --unit its systemd unit (docs/front.md, "The exposure model")."""
    from specdeploy.front import haproxy, listener
    from specdeploy.profile import load_profile

    loaded = load_profile(profile)
    drain_s = loaded.migration.drain_timeout_s
    if unit:
        sys.stdout.write(listener.render_unit(drain_s))
        return
    text = listener.render(
        loaded.front,
        address=listener.require_address(address),
        port=loaded.engine.serve.port,
        drain_s=drain_s,
        profile=loaded.name,
    )
    if validate:
        haproxy.check(text)
    sys.stdout.write(text)
