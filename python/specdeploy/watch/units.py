"""The light gate's systemd units: a oneshot service running `specdeploy watch run` and the timer
that starts it every `watch.interval_s` seconds (the profile's, the one source of the interval).

The service names no profile and no key: each run reads the profile copy the installed engine
unit names (so after a rollback it judges the stack that serves, with that stack's thresholds).
It runs as its own account (core.layout.WATCH_USER), never root: the state directory's group, so
it reads the profile copies and the run record but neither the reports nor the secrets; the owner
of <state>/watch; in systemd-journal's group for the engine's startup log. The API key, in the
host's root-only key file (engine.secret), reaches it as a systemd credential (`LoadCredential=`,
read back by engine.secret.read): nothing secret is in its command line or environment. It never
restarts or rolls back anything.
"""

from __future__ import annotations

from pathlib import Path

from specdeploy.core import layout
from specdeploy.engine.units import RenderedUnit, credential_lines, install, require_renderable, systemd_quote
from specdeploy.profile import Profile

HEADER = (
    "# Managed by specdeploy (the watch role) from profile {name}: do not edit; change the profile's watch "
    "section and re-run the deploy."
)
# How long systemd lets one light gate run beyond its own deadline before it stops it.
STOP_MARGIN_S = 60


def render_service(profile: Profile, *, cli: str, host: layout.HostLayout) -> RenderedUnit:
    argv = [cli, "watch", "run", "--state-dir", str(host.state)]
    lines = [
        HEADER.format(name=profile.name),
        "[Unit]",
        "Description=specdeploy light gate: known answers, served identity, acceptance since the last run",
        f"After=network-online.target {layout.UNIT_NAME}.service",
        "",
        "[Service]",
        "Type=oneshot",
        f"User={layout.WATCH_USER}",
        f"Group={layout.WATCH_USER}",
        # the engine unit's journal: the startup log that names the speculative method (vLLM)
        "SupplementaryGroups=systemd-journal",
        # the root-only key file, read by systemd and handed to this run alone ($CREDENTIALS_DIRECTORY)
        *credential_lines(profile, host),
        f"ExecStart={' '.join(systemd_quote(a) for a in argv)}",
        f"TimeoutStartSec={int(profile.watch.timeout_s) + STOP_MARGIN_S}",
        # a few requests to the engine: never in the way of what it serves
        "Nice=10",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=full",
        "ProtectHome=read-only",
        "",
    ]
    return RenderedUnit(layout.WATCH_UNIT_FILES["service"].name, "\n".join(lines))


def render_timer(profile: Profile) -> RenderedUnit:
    interval = profile.watch.interval_s
    lines = [
        HEADER.format(name=profile.name),
        "[Unit]",
        f"Description=Run the specdeploy light gate every {interval} s (profile {profile.name}, watch.interval_s)",
        "",
        "[Timer]",
        # the first run one interval after the timer starts (the deploy's gate has just judged the stack),
        # then one interval after each run began
        f"OnActiveSec={interval}",
        f"OnUnitActiveSec={interval}",
        "AccuracySec=1s",
        f"Unit={layout.WATCH_UNIT_FILES['service'].name}",
        "",
        "[Install]",
        "WantedBy=timers.target",
        "",
    ]
    return RenderedUnit(layout.WATCH_UNIT_FILES["timer"].name, "\n".join(lines))


def render(profile: Profile, *, cli: str, host: layout.HostLayout) -> list[RenderedUnit]:
    require_renderable(profile, cli=cli, state_dir=str(host.state))
    return [render_service(profile, cli=cli, host=host), render_timer(profile)]


def install_units(units: list[RenderedUnit], directory: Path, *, check: bool = False) -> list[str]:
    """Write each unit that differs (atomically); the files that changed (or would, with `check`)."""
    return [str(Path(directory) / unit.filename) for unit in units if install(unit, directory, check=check)]
