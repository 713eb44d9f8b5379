"""haproxy.cfg rendered from the front's model (`config.FrontConfig`), and checked with the real
`haproxy -c`.

What the rendered file does (docs/front.md):

- one frontend, TLS only (`bind ADDRESS:PORT ssl crt PEM`, TLS 1.2 at least): the site
  certificate's chain and key in one PEM file, as HAProxy reads it;
- the allow-list: an ACL matching the request path exactly (`path -m str`, the query string
  aside) against `allow_paths`; any other path is answered by the front itself (403 or 404)
  and never reaches an engine. The match is on the path as sent: `/v1/../metrics`,
  `/v1/models/`, `//metrics`, `/v1/%6dodels` match nothing and are refused — nothing is
  normalised first, so no spelling of a path reaches an engine unless it is exactly one allowed;
- the client's `Authorization` header (the API key) reaches the engine unchanged: HAProxy
  forwards request headers as they are and nothing here deletes or rewrites one;
- `option httplog` without any `capture request header`: the log line holds the method, path
  and status, never a header, so the key is never logged;
- each engine host reached over mutual TLS (`ssl verify required ca-file ... verifyhost NAME crt ...`):
  its listener's certificate verified against the site CA and the host's inventory name, the front's
  client certificate presented (the only one the listener accepts, `front/listener.py`); plain HTTP
  only to an engine on the front host's own loopback;
- one backend of the engine hosts, health-checked with `GET <health_path>` (HTTP/1.1), spread by
  `balance` (leastconn by default: streams are long); a server in `maint` is rendered
  `disabled`, one in `drain` with weight 0 (HAProxy has no configuration keyword for drain;
  `runtime.set_state(..., "ready")` restores the weight);
- the runtime API on a unix socket, `mode 600 level admin`: root only, since `level admin` may
  change every server's state.
- HAProxy binds its port and reads its certificate as root, then its workers run as `user`/`group`
  (Debian's haproxy), jailed in `chroot` (an empty directory), at most `maxconn` connections;
- HAProxy's Prometheus exporter on `metrics_address:metrics_port` (loopback by default), GET
  /metrics only: `haproxy_server_status{proxy="engines",state=...}` feeds the alert on a server
  left drained or in maint (monitoring/alerts.yml);
- the servers' states are read at start from `server_state_file`, which `save_state` (the
  service's reload and stop, ansible/roles/front) writes from the running HAProxy first: drain and
  maint survive a reload or restart.

The file holds paths and addresses only, never a secret; it is built as plain text (no template
engine, no shell), every value in it validated by the model first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from specdeploy.core.errors import SpecdeployError
from specdeploy.front.config import BACKEND, FRONTEND, WEIGHT, Backend, FrontConfig, backup_name
from specdeploy.host import command

HAPROXY = "haproxy"
CHECK_TIMEOUT_S = 30.0
DENY_BODY = "specdeploy front: this path is not served here"
# the series of HAProxy's exporter monitoring/alerts.yml reads (one per server and state, 1 for its state)
SERVER_STATE_SERIES = "haproxy_server_status"


class HaproxyConfigError(SpecdeployError):
    """`haproxy -c` refused a rendered haproxy.cfg, or could not run."""

    exit_code = 1


def duration(seconds: float) -> str:
    """HAProxy's time format: whole seconds as `600s`, anything else in milliseconds."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def bind_address(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _tls(backend: Backend, config: FrontConfig) -> str:
    if not backend.tls:
        return ""
    # mutual TLS to the engine host's listener: its certificate verified against the site CA and the
    # host's name; ours presented (the only one it accepts); health checks take the same hop
    return (
        f" ssl verify required ca-file {config.engine_ca_path} verifyhost {backend.name}"
        f" crt {config.client_cert_path} check-ssl"
    )


def _server(backend: Backend, config: FrontConfig) -> str:
    line = f"    server {backend.name} {backend.endpoint} weight {0 if backend.state == 'drain' else WEIGHT}"
    return line + _tls(backend, config) + (" disabled" if backend.state == "maint" else "")


def _backup(backend: Backend, config: FrontConfig) -> str:
    """The host's backup twin: in maint until a cutover puts it in (OLD, the way back while NEW is down)."""
    server = f"    server {backup_name(backend.name)} {backend.endpoint} backup weight {WEIGHT}"
    return f"{server}{_tls(backend, config)} disabled"


def render(config: FrontConfig) -> str:
    """The haproxy.cfg of this front, as text."""
    # a foreground haproxy logs to its own stream, unframed; a service to syslog
    raw = config.log in ("stderr", "stdout")
    log = f"log {config.log} format raw local0" if raw else f"log {config.log} local0"
    source = f" from profile {config.profile}" if config.profile else ""
    lines = [
        f"# The site's front door, rendered by `specdeploy front render`{source}: do not edit by hand",
        "# (docs/front.md). Only the paths of the allow-list reach an engine; the Authorization header",
        "# passes through unchanged and is never logged.",
        "global",
        f"    {log}",
        f"    stats socket {config.runtime_socket} mode 600 level admin",
        "    stats timeout 2m",
        "    # bound and certificate read as root; every request parsed by an unprivileged, jailed worker",
        f"    user {config.user}",
        f"    group {config.group}",
        f"    chroot {config.chroot}",
        f"    maxconn {config.maxconn}",
        "    # the servers' states (drain, maint, weight) saved before a reload or stop (`specdeploy front",
        "    # save-state`) and read back at start: a reload never puts a drained host back in service",
        f"    server-state-file {config.server_state_file}",
        "    ssl-default-bind-options ssl-min-ver TLSv1.2",
        "    ssl-default-server-options ssl-min-ver TLSv1.2",
        "",
        "defaults",
        "    mode http",
        "    load-server-state-from-file global",
        "    log global",
        "    # method, path, status and timings; no header is captured, so the API key never is",
        "    option httplog",
        "    option dontlognull",
        "    option forwardfor",
        "    # each answer closes the connection to the engine host (the client's stays open): an idle connection",
        "    # kept to a host's listener would hold its soft stop, and `systemctl stop` of the engine, for as long",
        "    # as its bound (front/listener.py)",
        "    option http-server-close",
        f"    timeout connect {duration(config.timeout_connect_s)}",
        "    # a health check's answer may take as long as a connection (unset, it is the check's interval:",
        "    # a loaded engine slow by 2 s for three checks would be taken out)",
        f"    timeout check {duration(config.timeout_connect_s)}",
        f"    timeout client {duration(config.timeout_client_s)}",
        f"    timeout server {duration(config.timeout_server_s)}",
        f"    timeout http-request {duration(config.timeout_http_request_s)}",
        "    # a request whose engine host failed before answering (a refused connection, closed without a byte",
        "    # of answer) is sent again, to another server each time: OLD's backup after a cutover",
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response",
        "",
        f"frontend {FRONTEND}",
        f"    bind {bind_address(config.listen_address, config.listen_port)} ssl crt {config.cert_path} alpn http/1.1",
        "    # the allow-list: the exact path as sent, nothing normalised first",
        f"    acl allowed_path path -m str {' '.join(config.allow_paths)}",
        f'    http-request return status {config.deny_status} content-type text/plain string "{DENY_BODY}" '
        "unless allowed_path",
        f"    default_backend {BACKEND}",
        "",
        "# HAProxy's own Prometheus exporter: each engine host's state (up, drain, maint) and traffic, for",
        "# monitoring/alerts.yml (a server left drained or in maint). GET /metrics only, unlogged.",
        "frontend metrics",
        f"    bind {bind_address(config.metrics_address, config.metrics_port)}",
        "    no log",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    http-request return status 404",
        "",
        f"backend {BACKEND}",
        f"    balance {config.balance}",
        "    option httpchk",
        f"    http-check send meth GET uri {config.health_path} ver HTTP/1.1 hdr Host specdeploy-front",
        "    http-check expect status 200",
        # a refused connection takes the host out at once (its listener refuses while its engine is down);
        # the health checks put it back
        f"    default-server check inter {duration(config.check_interval_s)} fall 3 rise 2 "
        "observe layer4 error-limit 1 on-error mark-down",
        *(_server(backend, config) for backend in config.backends),
        *(_backup(backend, config) for backend in config.backends),
        "",
    ]
    return "\n".join(lines)


def find_haproxy(program: str = HAPROXY) -> str:
    """The haproxy executable (a path, or a name looked up on PATH)."""
    found = shutil.which(program)
    if found is None:
        raise HaproxyConfigError(
            f"cannot check haproxy.cfg: {program} not found (PATH={os.environ.get('PATH', '')})",
            hint="install Debian's haproxy package (scripts/system-deps.sh does), or pass --no-validate to write "
            "the file unchecked",
        )
    return found


def check_file(
    path: Path, *, haproxy: str = HAPROXY, timeout_s: float = CHECK_TIMEOUT_S, shown: str | None = None
) -> str:
    """Run `haproxy -c -f PATH`; its report when the file is valid, else HaproxyConfigError with
    HAProxy's own alerts (it names the line and what is wrong). `shown`: how the file is named in
    the message (default its path)."""
    program = find_haproxy(haproxy)
    name = shown or str(path)
    try:
        done = command.run([program, "-c", "-f", str(path)], timeout=timeout_s)
    except command.ProgramRunError as exc:
        raise HaproxyConfigError(f"could not check {name}: {exc.message}", hint=exc.hint) from None
    report = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        alerts = [line.strip() for line in report.splitlines() if "ALERT" in line] or report.splitlines()[-10:]
        raise HaproxyConfigError(
            f"haproxy -c refused {name} (exit {done.returncode}):\n  "
            + "\n  ".join(a.replace(str(path), name) for a in alerts),
            hint="correct what HAProxy names above, in the profile's front: section or the options: the certificate "
            "is one PEM file holding the chain and the private key (cat cert.pem key.pem); a server's host name must "
            "resolve where haproxy runs (prefer the internal IP address its listener takes); to render for "
            "another machine, pass --no-validate and run `haproxy -c -f FILE` there",
        )
    return report


def check(text: str, *, haproxy: str = HAPROXY, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """`check_file` for a rendered haproxy.cfg that is not on disk yet (a private temporary copy)."""
    with tempfile.TemporaryDirectory(prefix="specdeploy-front-") as tmp:
        path = Path(tmp) / "haproxy.cfg"
        path.write_text(text)
        return check_file(path, haproxy=haproxy, timeout_s=timeout_s, shown="the rendered haproxy.cfg")
