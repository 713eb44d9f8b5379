"""The light gate's systemd units: a oneshot service running `specdeploy watch run` and the timer
that starts it every `watch.interval_s` seconds (the profile's, the one source of the interval).

The service names no profile and no key: each run reads the profile copy the installed engine
unit names (so after a rollback it judges the stack that serves, with that stack's thresholds).
It runs as its own account (core.layout.WATCH_USER), never root: the state directory's group, so
it reads the profile copies and the run record but neither the reports nor the secrets; the owner
of <state>/watch; in systemd-journal's group for the engine's startup log. The API key stays in
the host's root-only key file (engine.secret): for each run, systemd's privileged ExecStartPre=+
copies it (0400) into the run's own RuntimeDirectory=, the account's alone and removed when the run
ends, and $SPECDEPLOY_KEY_FILE names that copy (engine.secret.read). systemd's LoadCredential= would
do the same, but on systemd 257 nested in a container (the rehearsal's trixie host) it hands the
service an empty credentials directory; this way runs alike everywhere. Nothing secret is in its
command line or environment. It never restarts or rolls back anything.
"""

from __future__ import annotations

from pathlib import Path

from specdeploy.core import layout
from specdeploy.engine import launch
from specdeploy.engine.units import RenderedUnit, install, require_renderable, systemd_quote
from specdeploy.profile import Profile

HEADER = (
    "# Managed by specdeploy (the watch role) from profile {name}: do not edit; change the profile's watch "
    "section and re-run the deploy."
)
# How long systemd lets one light gate run beyond its own deadline before it stops it.
STOP_MARGIN_S = 60


def _key_lines(profile: Profile, host: layout.HostLayout) -> list[str]:
    """The API key for one run: systemd (as root: `+`) copies the root-only key file into the run's
    runtime directory, readable by the light gate's account alone; none for a profile without a key."""
    key = profile.engine.serve.api_key
    if key is None:
        return []
    copy = layout.WATCH_RUNTIME_DIR / key.secret
    install = ["/usr/bin/install", "-m", "0400", "-o", layout.WATCH_USER, "-g", layout.WATCH_USER]
    return [
        f"RuntimeDirectory={layout.WATCH_RUNTIME_DIR.name}",
        "RuntimeDirectoryMode=0700",
        f"ExecStartPre=+{' '.join(systemd_quote(a) for a in [*install, str(host.secret_file(key.secret)), str(copy)])}",
        f"Environment={launch.KEY_FILE_ENV}={copy}",
    ]


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
        # the root-only key file, copied for this run alone into its runtime directory (removed at its end)
        *_key_lines(profile, host),
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
