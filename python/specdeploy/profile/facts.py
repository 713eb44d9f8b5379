"""What the Ansible roles need to know, computed once per play: `specdeploy facts`.

Before this existed, four roles each re-ran `specdeploy profile show --json` and the role
defaults repeated the host paths and the unit name that the Python code also defined; a
site that moved its models to a data disk had to change them in several places and hope.
Now one task runs this (on the controller, from the same checkout whose profile and wheel
it deploys), registers the result as `specdeploy_facts`, and every role reads only that.
The inventory's path overrides go in; every path a role needs comes out already joined,
so no role composes a path of its own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from specdeploy.core import layout, progress, verdicts
from specdeploy.profile.schema import Profile


def resolved_yaml(profile: Profile) -> str:
    """The profile as one self-contained YAML document (what a host keeps of a site override)."""
    source = profile.site_override.file if profile.site_override else "its file"
    header = f"# {profile.name}, resolved from {source}: written by the deploy, do not edit\n"
    return header + yaml.safe_dump(profile.model_dump(mode="json", exclude_none=False), sort_keys=False)


def deploy_facts(
    profile: Profile,
    host: layout.HostLayout,
    install: layout.InstallLayout,
    *,
    publish_host: str | None = None,
) -> dict[str, Any]:
    """The profile values, host paths and names the roles use, as one JSON-ready document."""
    installed = install.to_json()
    drafter = profile.drafter
    gated = [m.repo for m in (profile.target, drafter) if m is not None and m.gated]
    # the revisions themselves are resolved on the host (`weights serve`): the roles name the links
    paths = host.to_json() | {
        "image_archive": str(host.image_archive),
        "base_image_archive": str(host.state / "base-image.tar"),
        "weights_archive": str(host.state / "weights.tar"),
    }
    engine_name = profile.engine.archive_name()
    venv = profile.engine.runtime == "venv"
    engine = (
        {
            "name": engine_name,
            "spec": profile.engine.requirement(),
            "archive": str(install.engines / f"{engine_name}.tar"),
            "root": str(install.engines),
        }
        if engine_name and venv
        else None
    )
    image = profile.engine.image
    return {
        "profile": {
            "name": profile.name,
            "file": str(Path(installed["profiles"]) / f"{profile.name}.yaml"),
            "engine": profile.engine.kind,
            "runtime": profile.engine.runtime,
            "container": profile.engine.runtime == "container",
            # no GPU: no nvidia-smi, CDI or GPU device (the CPU rehearsal's container profile)
            "gpu": profile.uses_gpus,
            "tensor_parallel_size": profile.engine.serve.tensor_parallel_size,
            "port": profile.engine.serve.port,
            "speculative_method": profile.engine.speculative.method,
            "has_drafter_config": drafter is not None and drafter.config is not None,
            "gated_repos": gated,
            # the secret the engine's API key is stored as (engine.secret), or None: no key
            "api_key": profile.engine.serve.api_key.secret if profile.engine.serve.api_key else None,
            # a site's override file (profile.load `extends`): the host gets the resolved profile, which
            # records the override, never a file that needs its base beside it
            "site_override": profile.site_override is not None,
            "resolved": resolved_yaml(profile) if profile.site_override is not None else None,
        },
        "install": installed,
        # venv runtime: the engine's own archive and venv root (None for container profiles)
        "engine": engine,
        # container runtime: every file `podman build` reads from the checkout (None for venv), and
        # the engine's wheel archive from the wheelhouse when the image installs it from there
        "image": (
            {
                # a pinned image lock too: the build bind-mounts locks/images/ (unresolved: the build refuses)
                "context_files": [image.containerfile, layout.GUARDS_IN_CONTEXT, layout.LAUNCHER_IN_CONTEXT]
                + ([image.lock.file] if image.lock is not None and image.lock.resolved else []),
                "engine_wheels": (
                    {"archive": f"{engine_name}.tar", "in_context": layout.ENGINE_WHEELS_IN_CONTEXT}
                    if image.engine_wheels
                    else None
                ),
            }
            if image
            else None
        ),
        "paths": paths,
        # what gpu_runtime installs, by exact version, and the image it pulls, by digest (issue 21):
        # `pinned` holds `name=version` for apt, `unresolved` each unpinned package's source (refused)
        "host": host_pins(profile),
        # the light gate after the deploy (the watch role): where its settings, result and units go;
        # its interval and thresholds stay in the profile, which `specdeploy watch units` reads
        "watch": {
            "dir": str(host.watch),
            # the light gate's account (its service's User=): owns the directory above
            "user": layout.WATCH_USER,
            "uid": layout.WATCH_UID,
            "config": str(host.watch_config),
            "result": str(host.watch_result),
            "textfile": str(layout.DEFAULT_TEXTFILE),
            "unit_dir": str(layout.SYSTEMD_UNIT_DIR),
            "service": layout.WATCH_UNIT_FILES["service"].name,
            "timer": layout.WATCH_UNIT_FILES["timer"].name,
            "alert_rules": str(install.monitoring / "alerts.yml"),
            # both units' files, for a decommission to stop and remove: the timer first (stopped first,
            # it cannot start the service again)
            "files": [str(layout.WATCH_UNIT_FILES["timer"]), str(layout.WATCH_UNIT_FILES["service"])],
        },
        # the site's front door (docs/front.md): the profile's front: settings the front role installs
        # HAProxy with, and what deploy.yml's drain of a host waits for (migration.drain_timeout_s)
        "front": {
            "cert": profile.front.cert_path,
            "socket": profile.front.runtime_socket,
            # saved before each reload and stop of HAProxy's service, read back at its start
            "state_file": profile.front.server_state_file,
            # where HAProxy's service gets its drop-in (the states saved before a reload or stop)
            "systemd_dir": str(layout.SYSTEMD_UNIT_DIR),
            "config": str(layout.HAPROXY_CONFIG),
            # the engine host's listener (front/listener.py): the front's only way to its engine
            "listener": {
                "unit": layout.LISTENER_UNIT_NAME,
                "unit_file": str(layout.LISTENER_UNIT_FILE),
                "config": str(layout.LISTENER_CONFIG),
                "cert": profile.front.listener_cert_path,
                "ca": profile.front.listener_ca_path,
            },
            "engine_ca": profile.front.engine_ca_path,
            "client_cert": profile.front.client_cert_path,
            "drain_timeout_s": profile.migration.drain_timeout_s,
        },
        "fetch": {"user": layout.FETCH_USER, "uid": layout.FETCH_UID},
        # the gate's report in each run's directory (<state>/runs/<run id>/<report>): the smoke_gate role names it
        # the deploy starts the gate as its unit, then waits for it in looks of `wait_s` (each printing the
        # gate's progress line as the task's retry), `attempts` of them: the profile's smoke.gate_timeout_s
        "gate": {
            "report": layout.GATE_REPORT,
            "wait_s": progress.LOOK_S,
            "running_exit": verdicts.EXIT_RUNNING,  # gate-wait's while the gate runs: look again
            "attempts": math.ceil(profile.smoke.gate_timeout_s / progress.LOOK_S),
        },
        "unit": {
            "name": layout.UNIT_NAME,
            "file": str(layout.UNIT_FILES[profile.engine.runtime]),
            "dir": str(layout.UNIT_FILES[profile.engine.runtime].parent),
            # every runtime's unit file (a decommission removes whichever a host has)
            "files": [str(path) for path in layout.UNIT_FILES.values()],
            "user": layout.ENGINE_USER,
            "uid": layout.ENGINE_UID,
            "user_home": str(layout.ENGINE_HOME),
            # the host address a container engine's port is published on (inventory override)
            "publish_host": publish_host or layout.DEFAULT_PUBLISH_HOST,
        },
    }


def host_pins(profile: Profile) -> dict[str, Any]:
    """The host packages and check image the profile pins, for the gpu_runtime role."""
    host = profile.host
    packages = host.packages if host else {}
    check = host.check_image if host else None
    return {
        "pinned": {name: f"{name}={pin.value}" for name, pin in packages.items() if pin.resolved},
        "unresolved": {name: pin.source for name, pin in packages.items() if not pin.resolved},
        "check_image": f"{check.name.rsplit(':', 1)[0]}@{check.digest.value}"
        if check and check.digest.resolved
        else None,
        "check_image_source": check.digest.source if check else None,
    }
