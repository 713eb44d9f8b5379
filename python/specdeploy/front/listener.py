"""The engine host's listener: the only way to its engine from the network, for the front alone,
over mutual TLS (issue 35; docs/front.md, "The exposure model").

Failure prevented: an engine port published on the internal address answered every host of the
internal network — `/invocations` (full inference), `/tokenize` and `/metrics` without the API key —
and the front sent the one shared Bearer key, prompts and answers to it in clear.

How: behind a front, the engine publishes on the host's loopback only (engine/units.py), where the
gate, the light gate and the bench reach it on the host. A HAProxy of its own (`specdeploy-engine-
listener.service`, not the front's) takes the internal address and the engine's port, in TCP mode:

- TLS with the host's certificate (signed by the site CA, naming the host by its inventory name,
  which the front verifies: `verifyhost`);
- `verify required` against the site CA: a client without a certificate, or with one from another CA,
  is refused in the handshake, before a byte of HTTP: every route of the engine, whatever its route
  table holds, is out of reach;
- and only the front's own certificate (its common name, `front.client_name`): another host's
  certificate signed by the same CA (a registry's, a hub's) is refused too;
- bytes passed, unparsed, to the engine on 127.0.0.1 at the same port; run as HAProxy's unprivileged
  account, chrooted, with a connection limit; its log names addresses and timings, never a byte of a
  request.

The file holds paths and addresses only, never a secret; every value is validated by the profile's
schema or here first. The unit is Debian's haproxy.service reduced to what this needs.
"""

from __future__ import annotations

import ipaddress

from specdeploy.core import layout
from specdeploy.core.errors import UsageError
from specdeploy.front.haproxy import bind_address, duration
from specdeploy.profile.schema import FrontSpec

FRONTEND = "engine_tls"
BACKEND = "engine"
HAPROXY_BIN = "/usr/sbin/haproxy"


def require_address(address: str) -> str:
    """The address the listener takes: one IP address of the engine host, neither a wildcard (it would
    take the loopback port the engine itself listens on) nor loopback (the front could not reach it)."""
    try:
        parsed = ipaddress.ip_address(address.removeprefix("[").removesuffix("]"))
    except ValueError:
        raise UsageError(
            f"--address {address!r}: expected an IP address of the engine host (its internal address), found "
            "something else; nothing was written",
            hint="set the inventory's specdeploy_publish_host to the host's internal address",
        ) from None
    if parsed.is_unspecified or parsed.is_loopback:
        raise UsageError(
            f"--address {address!r}: expected the engine host's internal address, found "
            f"{'a wildcard' if parsed.is_unspecified else 'a loopback address'}: "
            + (
                "it would also take the loopback port the engine listens on"
                if parsed.is_unspecified
                else "the front could not reach it"
            )
            + "; nothing was written",
            hint="set the inventory's specdeploy_publish_host to the host's internal address (the one the front "
            "reaches it on: specdeploy_internal_address)",
        )
    return str(parsed)


def render(front: FrontSpec, *, address: str, port: int, drain_s: float, profile: str | None = None) -> str:
    """The listener's haproxy.cfg: `address:port` over mutual TLS to the engine on 127.0.0.1:`port`
    (`address` as `require_address` accepts it; a test may take another loopback address). `drain_s`:
    how long a stopping listener lets the requests in flight through it finish (the profile's
    migration.drain_timeout_s; `render_unit`)."""
    source = f" from profile {profile}" if profile else ""
    lines = [
        f"# The engine host's listener, rendered by `specdeploy front listener`{source}: do not edit by hand",
        "# (docs/front.md). The front's only way to the engine: mutual TLS, the front's certificate alone.",
        "global",
        "    log stdout format raw local0",
        f"    user {front.user}",
        f"    group {front.group}",
        f"    chroot {front.chroot}",
        f"    maxconn {front.maxconn}",
        "    ssl-default-bind-options ssl-min-ver TLSv1.2",
        "    # stopped (its unit's SIGUSR1, before the engine stops): it stops listening at once, so the front",
        "    # sends new requests elsewhere, and lets those in flight finish for at most this long",
        f"    hard-stop-after {duration(drain_s)}",
        "",
        "defaults",
        "    mode tcp",
        "    log global",
        "    # client and server addresses, bytes and timings; nothing of a request is read or logged",
        "    option tcplog",
        "    option dontlognull",
        "    # the engine is on this host's loopback: a connection that does not open at once never will (a",
        "    # container just killed: its port forwarded into the void until podman cleans it up)",
        "    timeout connect 1s",
        "    timeout check 1s",
        "    retries 1",
        f"    timeout client {duration(front.timeout_client_s)}",
        f"    timeout server {duration(front.timeout_server_s)}",
        "",
        f"frontend {FRONTEND}",
        "    # no certificate, one from another CA: refused in the handshake, before any byte reaches the engine",
        f"    bind {bind_address(address, port)} ssl crt {front.listener_cert_path} ca-file {front.listener_ca_path} "
        "verify required alpn http/1.1",
        "    # a certificate of the site CA that is not the front's (a registry's, a hub's): refused as well",
        f"    tcp-request session reject unless {{ ssl_c_s_dn(CN) -m str {front.client_name} }}",
        "    # the engine down: the front's connection refused at once (not accepted and then closed), so the front",
        "    # takes this host out and sends the request to another (OLD's backup after a cutover)",
        f"    tcp-request connection reject if {{ nbsrv({BACKEND}) eq 0 }}",
        f"    default_backend {BACKEND}",
        "",
        f"backend {BACKEND}",
        "    # the engine, on this host's loopback only",
        # a failed connection to the engine marks it down at once (not at the next check): from then on
        # the front's connections are refused, and the front sends them elsewhere
        f"    server {BACKEND} 127.0.0.1:{port} check inter 1s fall 1 rise 2 observe layer4 error-limit 1 "
        "on-error mark-down",
        "",
    ]
    return "\n".join(lines)


def render_unit(drain_s: float, config_path: str = str(layout.LISTENER_CONFIG), haproxy: str = HAPROXY_BIN) -> str:
    """The listener's systemd unit (Debian's haproxy.service, reduced): master-worker, notify, reload
    checks the file first and keeps the connections in flight.

    Bound to the engine's unit, so that `systemctl stop` of the engine loses no request (issue 35):
    `PartOf=` stops (and restarts) the listener with the engine, and `After=` makes systemd stop the
    listener first. Its stop is HAProxy's soft stop (SIGUSR1): it stops listening at once, the front's
    connections are refused and it sends new requests to another server (OLD's backup after a
    cutover), while the requests in flight finish on the engine, which still runs, for at most
    `drain_s` (`hard-stop-after`); only then does the engine stop. `WantedBy=` the engine: starting
    the engine starts its listener again."""
    engine = f"{layout.UNIT_NAME}.service"
    return "\n".join(
        [
            "# Installed by specdeploy (ansible/roles/front/tasks/listener.yml): the engine host's listener,",
            "# the front's only way to the engine (docs/front.md). Rendered by `specdeploy front listener --unit`.",
            "[Unit]",
            "Description=specdeploy engine listener (mutual TLS from the front to the engine on loopback)",
            f"After=network-online.target {engine}",
            "Wants=network-online.target",
            "# stopped, and restarted, with the engine; stopped before it (After=): the requests in flight finish",
            f"PartOf={engine}",
            "",
            "[Service]",
            "Type=notify",
            f"Environment=CONFIG={config_path} PIDFILE=/run/{layout.LISTENER_UNIT_NAME}.pid",
            f"ExecStartPre={haproxy} -Ws -f $CONFIG -c -q",
            f"ExecStart={haproxy} -Ws -f $CONFIG -p $PIDFILE",
            f"ExecReload={haproxy} -Ws -f $CONFIG -c -q",
            "ExecReload=/bin/kill -USR2 $MAINPID",
            "# a soft stop: no new connection, those in flight finish (hard-stop-after in the file bounds them)",
            "KillSignal=SIGUSR1",
            "KillMode=mixed",
            f"TimeoutStopSec={int(drain_s) + 10}",
            "Restart=always",
            "RestartSec=2",
            "",
            "[Install]",
            f"WantedBy=multi-user.target {engine}",
            "",
        ]
    )
