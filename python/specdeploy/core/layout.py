"""Where specdeploy keeps things on a host, and what its engine unit is called: one definition.

Every path a deploy touches derives from the four roots below; the Python stages, the
Ansible roles (through `specdeploy facts`) and the rehearsal read them from here, so a
path cannot differ between the place that writes a file and the place that reads it. A
site overrides any root per host or group in its inventory (models on a data disk, say):
`HostLayout.of(...)` takes those overrides and every command that touches the host accepts
the same `--models-dir`, `--serving-dir`, `--state-dir`, `--cache-dir`.

    <models>/<org>/<name>/<revision>/   verified downloads, one directory per revision (weights.store)
    <serving>/target                    link to the target revision the engine serves
    <serving>/drafter-source            link to the drafter revision its serving directory is built from
    <serving>/drafter                   link to drafter-builds/<sha>-<ns>/: the drafter's config.json + links
    <state>/specdeploy.lock             the site's lock as the deploy pushed it (root's, 0644), plus what
                                        this host resolved since (fetched back after its gate)
    <state>/profiles/<sha>/<name>.yaml  the profile copy each installed unit names
    <state>/rollback/                   what the current deploy run replaced (core.keeper)
    <state>/runs/<run-id>/gate.json     every gate run's report, with the profile and lock it ran with
    <state>/verified -> runs/<run-id>   the last run whose gate passed
    <state>/secrets/<name>              the API key (root, mode 0600): podman secret / systemd credential source
    <state>/watch/result.json           the last light gate's result (`specdeploy watch run`, the timer's)
    <state>/watch/counters.json         the engine's speculative-decoding counters as that light gate read
                                        them: the next one judges the difference (acceptance since then)
    <state>/watch-config.json           the light gate's host settings: the textfile and the failure hook
                                        (the watch role writes it from the inventory)
    <state>/watch/lock                  held while a light gate runs
    <cache>/                            the engine's writable cache (container profiles)
    /opt/specdeploy/                    the CLI's venv, wheelhouse, profiles, image build context
    /opt/specdeploy/engines/<pkg>-<version>-<sha12>/   one engine venv per engine archive (venv runtime)
    /opt/specdeploy/monitoring/alerts.yml   the Prometheus alert rules shipped with the bundle
    /etc/systemd/system/specdeploy-watch.{service,timer}   the light gate and its timer
    /var/lib/prometheus/node-exporter/specdeploy.prom  the light gate's textfile (node_exporter's textfile
                                        collector; Debian's default directory; the inventory may move it)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_ROOT = Path("/var/lib/specdeploy")
INSTALL_ROOT = Path("/opt/specdeploy")

UNIT_NAME = "specdeploy-engine"
# The gate's report in each run's directory (HostLayout.gate_report): the gate writes it, the weights'
# pruning, the migration and the rehearsal read it, each through here (issue 37: a literal in a lower
# stage was a dependency on the gate that the layering test could not see).
GATE_REPORT = "gate.json"
# The gate's last progress line (what it is doing now), beside its report while it runs: a deploy
# that waits for a gate running as a unit reads it (gate.unit), so its play says which check runs
GATE_PROGRESS = "gate.progress"
# Where a container engine's port is published on the host, always: vLLM's API key guards only its
# /v1-style routes, so /metrics, /tokenize and /invocations must never reach the network. Behind a
# front, the host's listener takes its internal address (`specdeploy_publish_host`, front/listener.py).
DEFAULT_PUBLISH_HOST = "127.0.0.1"
# The build guard every Containerfile COPYs (relative to the build context, the repository
# root) and where it lands in the image, where `image check` runs it.
GUARDS_IN_CONTEXT = "python/specdeploy/images/guards.py"
GUARDS_IN_IMAGE = "/opt/specdeploy/build_guards.py"
ENGINE_USER = "specdeploy"
ENGINE_HOME = DATA_ROOT / "home"
# The engine's uid and gid: the images run as 10001 (Containerfiles' USER), and a rootful
# container's uid is the host's, so the host's engine user has the same ids. Models and serving
# directories are group-readable by it (not by others: gated weights); the cache is its own.
ENGINE_UID = 10001
# The account the weight fetch runs as (`fetch --as-user`): it owns the models tree it writes into,
# its primary group the engine's (what it writes the engine reads); never root (issue 35).
FETCH_USER = "specdeploy-fetch"
FETCH_UID = 10002
# The account the light gate runs as (its service's User=; watch/units.py): it owns <state>/watch
# and the textfile's directory's group, reads the state (the state directory's group is its own)
# but not the reports (0640, root's group) nor the secrets (0700); the API key reaches it as a
# copy for one run (WATCH_RUNTIME_DIR). The failure hook runs as this account too: never root (issue 35).
WATCH_USER = "specdeploy-watch"
WATCH_UID = 10003
# Where the light gate's service gets its copy of the API key for one run (its RuntimeDirectory=,
# the account's alone, removed when the run ends; watch/units.py).
WATCH_RUNTIME_DIR = Path("/run/specdeploy-watch")
# The launcher every engine starts through (engine.launch): in the build context and in the image.
LAUNCHER_IN_CONTEXT = "python/specdeploy/engine/launch.py"
LAUNCHER_IN_IMAGE = "/opt/specdeploy/launch.py"
# An image with `engine_wheels` (profile) reads the engine's wheel archive from the build context
# here, bind-mounted for one RUN: the wheels never become a layer.
ENGINE_WHEELS_IN_CONTEXT = "engine-wheels.tar"
# Where a container reads a podman secret mounted as a file.
SECRETS_IN_CONTAINER = "/run/secrets"
# Where each runtime's unit lives: podman's quadlet generator reads .container files from
# /etc/containers/systemd; a plain service lives with systemd's other local units.
SYSTEMD_UNIT_DIR = Path("/etc/systemd/system")
UNIT_FILES = {
    "container": Path("/etc/containers/systemd") / f"{UNIT_NAME}.container",
    "venv": SYSTEMD_UNIT_DIR / f"{UNIT_NAME}.service",
}
UNIT_HEADER = "# Managed by specdeploy from profile {name}: do not edit; change the profile and re-run the deploy."
# Names the copy of the profile a unit was rendered from, so a rollback proves the restored
# stack with the thresholds it was deployed with.
UNIT_PROFILE_LINE = "# specdeploy-profile-file: "

# The light gate after the deploy (`specdeploy watch run`): a oneshot service and the timer that
# starts it, plain systemd units beside the engine's.
WATCH_UNIT_NAME = "specdeploy-watch"
WATCH_UNIT_FILES = {
    "service": SYSTEMD_UNIT_DIR / f"{WATCH_UNIT_NAME}.service",
    "timer": SYSTEMD_UNIT_DIR / f"{WATCH_UNIT_NAME}.timer",
}
# node_exporter's textfile collector reads *.prom files from one directory: Debian's
# prometheus-node-exporter defaults to this one (docs/sources.md#watch).
DEFAULT_TEXTFILE = Path("/var/lib/prometheus/node-exporter") / "specdeploy.prom"

# The site's front door (docs/front.md): Debian's haproxy reads its configuration here.
HAPROXY_CONFIG = Path("/etc/haproxy/haproxy.cfg")
# The engine host's listener (front/listener.py): the front's only way to its engine, over mutual TLS,
# a HAProxy of its own (its own unit and file, beside a front's HAProxy if the host is both).
LISTENER_UNIT_NAME = "specdeploy-engine-listener"
LISTENER_CONFIG = Path("/etc/specdeploy/engine-listener.cfg")
LISTENER_UNIT_FILE = SYSTEMD_UNIT_DIR / f"{LISTENER_UNIT_NAME}.service"

DRAFTER_SERVING = "drafter"  # under <serving>
TARGET_SERVING = "target"
DRAFTER_BUILDS = "drafter-builds"  # beside the drafter's serving link: one directory per written version
DRAFTER_SOURCE = "drafter-source"


def unit_profile_file(unit_text: str) -> str | None:
    """The profile copy a rendered unit names in its header, or None."""
    for line in unit_text.splitlines():
        if line.startswith(UNIT_PROFILE_LINE):
            return line.removeprefix(UNIT_PROFILE_LINE).strip()
    return None


def installed_unit_file() -> Path | None:
    """The engine unit installed on this host (either runtime), or None."""
    return next((path for path in UNIT_FILES.values() if path.is_file()), None)


@dataclass(frozen=True)
class HostLayout:
    """The four roots of a host's specdeploy data and everything derived from them."""

    models: Path = DATA_ROOT / "models"
    serving: Path = DATA_ROOT / "serving"
    state: Path = DATA_ROOT / "state"
    cache: Path = DATA_ROOT / "cache"

    @classmethod
    def of(
        cls,
        *,
        models: str | Path | None = None,
        serving: str | Path | None = None,
        state: str | Path | None = None,
        cache: str | Path | None = None,
    ) -> HostLayout:
        """The default layout with a site's overrides (None or "" keeps the default)."""
        default = cls()
        return cls(
            models=Path(models) if models else default.models,
            serving=Path(serving) if serving else default.serving,
            state=Path(state) if state else default.state,
            cache=Path(cache) if cache else default.cache,
        )

    @property
    def lock(self) -> Path:
        return self.state / "specdeploy.lock"

    @property
    def rollback(self) -> Path:
        return self.state / "rollback"

    @property
    def runs(self) -> Path:
        return self.state / "runs"

    @property
    def verified(self) -> Path:
        return self.state / "verified"

    def run_dir(self, run_id: str) -> Path:
        """A run's own directory (its gate report, its restore outcome); `run_id` checked by the
        caller (core.keeper.check_run_id)."""
        return self.runs / run_id

    def gate_report(self, run_id: str) -> Path:
        """The gate's report of run `run_id`."""
        return self.run_dir(run_id) / GATE_REPORT

    def gate_progress(self, run_id: str) -> Path:
        """The last progress line of run `run_id`'s gate (GATE_PROGRESS)."""
        return self.run_dir(run_id) / GATE_PROGRESS

    @property
    def verified_gate_report(self) -> Path:
        """The report of the last run whose gate passed (through the `verified` link)."""
        return self.verified / GATE_REPORT

    @property
    def profiles(self) -> Path:
        return self.state / "profiles"

    @property
    def image_archive(self) -> Path:
        """Where the images role loads the engine image's archive from (`images_source: archive`): the
        controller's copy lands here, or `migrate prepare --image-from-old` seeds OLD's saved image here."""
        return self.state / "image.tar"

    @property
    def preflight(self) -> Path:
        """The last preflight's report (the preflight role's; `migrate plan` reads NEW's)."""
        return self.state / "preflight.json"

    @property
    def golden(self) -> Path:
        """Golden transcripts, one per served identity (gate.golden)."""
        return self.state / "golden"

    @property
    def secrets(self) -> Path:
        return self.state / "secrets"

    @property
    def hub_ca(self) -> Path:
        """The CA that signed the hub mirror's certificate, when the site gives one (`weights_hf_ca_src`):
        `specdeploy fetch --ca-file` checks the mirror against it (https:// only)."""
        return self.state / "hub-ca.crt"

    def secret_file(self, name: str) -> Path:
        """The root-only file holding secret `name` (the API key): the source of the podman
        secret, of the venv unit's credential, and what the gate sends."""
        return self.secrets / name

    @property
    def watch(self) -> Path:
        """The light gate's own state (`specdeploy watch run`)."""
        return self.state / "watch"

    @property
    def watch_result(self) -> Path:
        return self.watch / "result.json"

    @property
    def watch_counters(self) -> Path:
        return self.watch / "counters.json"

    @property
    def watch_config(self) -> Path:
        """The light gate's host settings (the textfile, the failure hook), written by the watch
        role: root's, its group the light gate's account, which reads them but, outside its own
        directory, cannot replace them (a root run of the light gate trusts them)."""
        return self.state / "watch-config.json"

    @property
    def watch_lock(self) -> Path:
        return self.watch / "lock"

    @property
    def drafter_serving(self) -> Path:
        return self.serving / DRAFTER_SERVING

    @property
    def target_serving(self) -> Path:
        return self.serving / TARGET_SERVING

    @property
    def drafter_source(self) -> Path:
        return self.serving / DRAFTER_SOURCE

    def download(self, repo: str) -> Path:
        """Where a hub repository's verified revisions live (one directory each)."""
        return self.models / repo

    def to_json(self) -> dict[str, str]:
        names = (
            "models", "serving", "state", "cache", "lock", "rollback", "runs", "verified", "golden", "preflight",
            "drafter_serving", "target_serving", "drafter_source", "hub_ca",
        )  # fmt: skip
        return {name: str(getattr(self, name)) for name in names}


def local_layout(workdir: Path) -> HostLayout:
    """The host layout rooted in a working directory (the rehearsal's local stacks, tests)."""
    return HostLayout(models=workdir / "models", serving=workdir / "serving", state=workdir, cache=workdir / "cache")


@dataclass(frozen=True)
class InstallLayout:
    """Where the CLI itself is installed on a host (the specdeploy role's work)."""

    root: Path = INSTALL_ROOT

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def monitoring(self) -> Path:
        """The alert rules shipped with the bundle (the watch role copies them here)."""
        return self.root / "monitoring"

    @property
    def engines(self) -> Path:
        """Engine venvs (venv runtime), one per engine archive, and the archives themselves."""
        return self.root / "engines"

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "venv": str(self.venv),
            "python": str(self.venv / "bin" / "python"),
            "cli": str(self.venv / "bin" / "specdeploy"),
            "wheelhouse": str(self.root / "wheelhouse"),
            "profiles": str(self.root / "profiles"),
            "build_context": str(self.root / "build"),
            "engines": str(self.engines),
        }
