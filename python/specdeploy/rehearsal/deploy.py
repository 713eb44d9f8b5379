"""The main job: `ansible-playbook deploy.yml -l rehearsal` against a disposable systemd host,
on the production path, serving the real model (profile cpu-rehearsal-smollm2: SmolLM2-135M-Instruct
and its 4-bit drafter, rehearsal.real_model; the container and migration chains' tests deploy the tiny
fixtures under cpu-rehearsal-container the same way).

Everything the play needs from the controller is prepared here and cached: a wheelhouse
(the host installs exactly it, offline, for its own Python), the engine image's local base as
an archive, the hub (olah behind a token-checking proxy, a test host of its own on the test
network, serving the fixture models as git repos), the host's secrets (a hub token and an API
key, in an ansible-vault file as a site keeps them, never in argv) and the host itself (booted when missing, reused
when running). On the host the play builds the engine image, fetches the weights from the hub
with the token, runs the engine under quadlet with the key, and gates it. The play's own gate
decides; this run's report (`<state>/runs/<run-id>/gate.json`, the run id chosen here and
handed to the play) is read back from the host — never an earlier run's.

The fixture models are generated on this machine, so their hub commits cannot be pinned in the
committed profile: the deployed copy of it (under the cache) pins the commits the hub serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.core import envlock, keeper, layout, progress
from specdeploy.core.cache import cache_dir, exclusive
from specdeploy.core.errors import ProgramError, SpecdeployError
from specdeploy.core.programs import ansible_program
from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import hosts, housekeeping, variants
from specdeploy.weights.fetch import models_of

ROOT = Path(__file__).resolve().parents[3]
HOST_NAME = "specdeploy-rehearsal"
HOST_SSH_PORT = 2320
PROFILE = "cpu-rehearsal-smollm2"
HOST_IP = "10.89.64.20"  # on the hub's test network (specdeploy.rehearsal.hub)
# Reproducible wheel bytes: an unchanged checkout gives an identical specdeploy wheel, so a
# re-run copies nothing and reinstalls nothing on the host.
SOURCE_DATE_EPOCH = "315532800"
# The site's lock, beside the inventory (ansible/roles/specdeploy/defaults: specdeploy_site_lock)
SITE_LOCK = "specdeploy.lock"


def checkout() -> Path:
    if not (ROOT / "ansible" / "deploy.yml").is_file():
        raise SpecdeployError(
            f"{ROOT} is not a specdeploy checkout (no ansible/deploy.yml)",
            hint="run the rehearsal deploy from a clone of the repository, in the venv scripts/setup.sh prints",
        )
    return ROOT


def check_controller() -> None:
    """What the main job needs on this machine, checked before anything is built or booted: the
    checkout, the cache directory, podman (the disposable host runs in it) and ansible-core's
    programs beside this Python (the dev extra)."""
    checkout()
    cache_dir()
    if shutil.which("podman") is None:
        raise ProgramError(
            "podman is not on PATH: the disposable rehearsal host runs in it; nothing was built or booted",
            hint="install podman >= 4.5 (`nix develop` provides it), then run this again",
        )
    for name in ("ansible-playbook", "ansible-vault"):
        ansible_program(name, why="the rehearsal deploys with ansible-core; nothing was built or booted")


def wheelhouse(*profiles: str) -> Path:
    """The controller-built wheelhouse for rehearsal hosts, keyed by the pins, with the engine
    archive of every profile named that installs its engine from wheels (default: cpu-rehearsal);
    the specdeploy wheel in it is rebuilt from the checkout each time (byte-identical when unchanged)."""
    root = checkout()
    # Keyed by what decides its bytes: the locks (a refreshed lock is a new wheelhouse; setup refuses a
    # pin in pyproject.toml the locks do not hold) and the script. Not pyproject.toml itself: a test
    # option added there once rebuilt the wheelhouse, every host's engine venv and the engine image.
    locks = sorted((root / envlock.LOCKS).glob("*.txt"))
    inputs = b"".join(p.read_bytes() for p in [root / "scripts" / "wheelhouse.sh", *locks])
    dest = cache_dir() / f"wheelhouse-{hashlib.sha256(inputs).hexdigest()[:12]}"
    with exclusive(dest.name):  # another run on this machine may be filling it now
        filled = _fill_wheelhouse(dest, root, profiles)
    housekeeping.mark_used(filled)
    housekeeping.prune(filled.parent, "wheelhouse", filled.name)  # older pins' (~1.3 GB each)
    return filled


def _fill_wheelhouse(dest: Path, root: Path, profiles: tuple[str, ...]) -> Path:
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    script = ["bash", str(root / "scripts" / "wheelhouse.sh"), str(dest)]
    for name in profiles or ("cpu-rehearsal",):
        engine = load_profile(name).engine
        spec = engine.requirement()
        if spec and not (dest / "engines" / f"{engine.archive_name()}.tar").is_file():
            print(f"wheelhouse: downloading the engine {spec} (once)", file=sys.stderr)
            progress.run([*script, "--engine", spec], env=env, echo=sys.stderr, echo_stdout=False)
    if not (dest / ".complete").exists():
        # its messages shown as they come; each line (pip's too) feeds the current step
        progress.run(script, env=env, echo=sys.stderr, echo_stdout=False)
        (dest / ".complete").touch()
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp, str(root)]
        subprocess.run(argv, check=True, env=env)
        (built,) = Path(tmp).glob("specdeploy-*.whl")
        current = dest / built.name
        if not (current.is_file() and current.read_bytes() == built.read_bytes()):
            for old in dest.glob("specdeploy-*.whl"):
                old.unlink()
            shutil.move(built, current)
        # The host installs the wheel with --require-hashes: its hash is the one of these bytes.
        envlock.write_wheel_lock(current, dest / "specdeploy.lock")
    return dest


def host() -> hosts.Host:
    """The disposable rehearsal host (Debian trixie, podman 5, on the hub's test network):
    reused when it runs from the current image and answers SSH, booted otherwise."""
    from specdeploy.rehearsal import hub

    state = cache_dir() / "rehearsal-host"
    state.mkdir(parents=True, exist_ok=True)
    image = hosts.host_image()
    found = hosts.running(HOST_NAME, HOST_SSH_PORT, state / f"{HOST_NAME}_ed25519", image)
    if found is not None:
        return found
    print(f"booting the disposable rehearsal host {HOST_NAME} (ssh on 127.0.0.1:{HOST_SSH_PORT})", file=sys.stderr)
    # the site's lock beside the inventory (main_job) belongs to the host it was resolved on: a new
    # host is a new site (its image ID, say, is its own build's)
    (state / SITE_LOCK).unlink(missing_ok=True)
    hub.ensure_network()
    return hosts.start(
        HOST_NAME, HOST_SSH_PORT, state, image=image, containers=True, network=hosts.Network(hub.NETWORK, HOST_IP)
    )


# The site's vault variables (docs/ansible.md "Vault setup (the hub token and the API key)") and the play
# variables they are mapped to
VAULT_VARIABLES = {"weights_hf_token": "vault_weights_hf_token", "engine_api_key": "vault_engine_api_key"}
VAULT_GROUP = "rehearsal"


@dataclass(frozen=True)
class Vault:
    """The play's secrets kept as a site keeps them: an ansible-vault encrypted file of `vault_*`
    variables, mapped to the play's variables in the inventory's group_vars, and the vault's
    password in a file only its owner reads (`--vault-password-file`). Nothing in argv."""

    file: Path
    password_file: Path

    def _vault(self, action: str, data: bytes, *, output: Path | None = None) -> bytes:
        """`ansible-vault <action>` as a program, the data on its standard input (never in argv).
        Not in-process: ansible-core patches `sys.intern` on import, which torch then refuses."""
        vault = ansible_program("ansible-vault", why="the rehearsal's secrets cannot be vaulted")
        argv = [
            str(vault), action, "--vault-password-file",
            str(self.password_file), "--output", str(output) if output else "-", "-",
        ]  # fmt: skip
        done = subprocess.run(argv, input=data, capture_output=True)
        if done.returncode != 0:
            raise SpecdeployError(
                f"ansible-vault {action} {self.file} failed: {done.stderr.decode(errors='replace').strip()[-300:]}",
                hint=f"remove {self.file.parent} to start with a new vault (the rehearsal's secrets are generated)",
            )
        return done.stdout

    def values(self) -> dict[str, str]:
        """The play variables (weights_hf_token, engine_api_key), decrypted."""
        if not self.file.is_file():
            return {}
        stored = json.loads(self._vault("decrypt", self.file.read_bytes()))
        return {play: stored[name] for play, name in VAULT_VARIABLES.items() if name in stored}

    def write(self, values: dict[str, str]) -> None:
        stored = json.dumps({VAULT_VARIABLES[play]: value for play, value in values.items()}).encode()
        partial = self.file.with_name(self.file.name + ".partial")
        partial.unlink(missing_ok=True)
        _write_private(partial, b"")  # owner-only before ansible-vault writes the ciphertext into it
        self._vault("encrypt", stored, output=partial)
        os.replace(partial, self.file)

    def group_vars(self, inventory: Path) -> None:
        """The vault file and its mapping beside the inventory, as `group_vars/<group>/` (a site's layout)."""
        directory = inventory.parent / "group_vars" / VAULT_GROUP
        directory.mkdir(parents=True, exist_ok=True)
        _write_private(directory / "vault.yml", self.file.read_bytes())
        mapping = "".join(f'{play}: "{{{{ {name} }}}}"\n' for play, name in VAULT_VARIABLES.items())
        _write_private(directory / "main.yml", mapping.encode())


def _write_private(path: Path, data: bytes) -> None:
    """Write `path` atomically, readable by its owner only from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(partial, path)


def rehearsal_vault(directory: Path, *, token: str | None = None, api_key: str | None = None) -> Vault:
    """The play's vault under `directory`: the hub token and the engine's API key, generated once
    per directory and kept (a re-run must not rotate them), with a random vault password."""
    kept = Vault(directory / "vault.yml", directory / "vault-password")
    if not kept.password_file.is_file():
        _write_private(kept.password_file, secrets.token_hex(32).encode())
    known = kept.values()
    values = {
        "weights_hf_token": token or known.get("weights_hf_token") or f"hf_{secrets.token_hex(17)}",
        "engine_api_key": api_key or known.get("engine_api_key") or f"sk-{secrets.token_hex(24)}",
    }
    if values != known:
        kept.write(values)
    return kept


def pinned_profile(
    profile: Profile, commits: dict[str, str], directory: Path, *, base: tuple[str, str] | None = None
) -> Path:
    """`profile` with its models pinned at the hub's commits, written to `directory/<name>.yaml`
    (the profiles directory the play deploys from): fixtures have no commit before the hub does.
    `base`: the engine image's base as pushed to the site registry (name, digest;
    engine_image.base_in_registry), which every builder and host takes by that digest."""

    def pin(repo: str) -> dict[str, str]:
        return {"value": commits[repo], "provenance": "rehearsal", "source": "the fixture repo's commit on the hub"}

    patch: dict[str, object] = {"target": {"revision": pin(profile.target.repo)}}
    if profile.drafter is not None:
        patch["drafter"] = {"revision": pin(profile.drafter.repo)}
    if base is not None:
        patch |= _base_patch(base)
    pinned = variants.derive(profile, profile.name, patch)
    return variants.materialize(pinned, directory)


def _base_patch(base: tuple[str, str]) -> dict[str, object]:
    """The engine image's base as pushed to the site registry (name, digest), as a profile patch."""
    digest = {"value": base[1], "provenance": "rehearsal", "source": "podman push --digestfile to the site registry"}
    return {"engine": {"image": {"base": {"name": base[0], "digest": digest}}}}


def _builder_lock(site_lock: Path, key: str) -> Any:
    """The builder's own lock for build key `key` (its base digest and image ID), beside the site's
    lock; the locks of other keys removed."""
    from specdeploy.profile.lock import Lock

    builder = site_lock.parent / "builder"
    lock = Lock(builder / f"{key}.lock")
    for stale in builder.glob("*.lock") if builder.is_dir() else []:
        if stale != lock.path:
            stale.unlink()
    return lock


def build_once(profile: Profile, *, wheels: Path, site: Any, site_lock: Path) -> str:
    """The documented flow on the controller, the site's builder: build the engine image (once per
    cache key), push it to the registry and record the registry's digest in the site's lock, which
    the play pushes to the host (its images stage pulls NAME@DIGEST). Returns the digest.

    A new build key is a new image: its digest supersedes the one the site's lock holds, the way
    `specdeploy lock update --key engine.image.digest` does it (printed, as a site would review it)."""
    from specdeploy.images import push
    from specdeploy.profile import site_lock as site_locks
    from specdeploy.profile.lock import Lock
    from specdeploy.rehearsal import engine_image

    # the builder's own lock, one per build key (its base digest and image ID)
    key = engine_image.archive_key(profile, context=checkout(), wheels=wheels)
    builder_lock = _builder_lock(site_lock, key)
    engine_image.build_on_controller(
        profile, context=checkout(), wheels=wheels, lock=builder_lock, cert_dir=site.cert_dir
    )
    print(f"pushing the engine image to the rehearsal's registry {site.address}", file=sys.stderr)
    with progress.step(f"pushing the engine image to {site.address}"):
        digest = push.push(
            profile, lock=builder_lock, registry=site.address, podman=hosts.PODMAN, cert_dir=site.cert_dir
        ).digest
    lock = Lock(site_lock)
    recorded = lock.value(profile.name, push.DIGEST_KEY)
    if recorded is not None and recorded != digest:
        rebuilt = tuple(k for k in (push.DIGEST_KEY, "engine.image.id") if lock.get(profile.name, k) is not None)
        plan = site_locks.plan_update(lock, profile, keys=rebuilt)
        site_locks.apply_update(lock, profile, plan)
        print(f"lock update: the engine image was rebuilt ({recorded} -> {digest})", file=sys.stderr)
    lock.record(profile.name, push.DIGEST_KEY, digest, by="image push", detail={"pushed_to": site.address})
    return digest


def playbook_argv(
    target: hosts.Host,
    inventory: Path,
    *,
    wheels: Path,
    archive: Path | None,
    run_id: str,
    profile: str = "cpu-rehearsal",
    profiles: Path | None = None,
    extra_vars: dict[str, str] | None = None,
    vault: Vault | None = None,
    host_vars: dict[str, str] | None = None,
) -> list[str]:
    """The play's command line; secrets (the token, the API key) come from the `vault`
    through the inventory's group_vars, never in argv.
    `host_vars` are the host's own inventory variables (unlike `-e`, they do not reach the tasks
    delegated to the controller)."""
    line = " ".join([target.inventory_line(), *(f"{k}={v}" for k, v in (host_vars or {}).items())])
    inventory.write_text(f"[rehearsal]\n{line}\n")
    variables = (
        {
            "specdeploy_profile": profile,
            "specdeploy_profiles_src": str(profiles or checkout() / "profiles"),
            "specdeploy_wheelhouse_src": str(wheels),
            "specdeploy_run_id": run_id,
        }
        | ({"weights_source": "archive", "weights_archive_src": str(archive)} if archive else {})
        | (extra_vars or {})
    )
    argv = [
        str(ansible_program("ansible-playbook", why="the rehearsal host cannot be deployed")),
        "deploy.yml",
        "-i",
        str(inventory),
        "-l",
        "rehearsal",
    ]
    for key, value in variables.items():
        argv += ["-e", f"{key}={value}"]
    if vault is not None:
        vault.group_vars(inventory)
        argv += ["--vault-password-file", str(vault.password_file)]
    return argv


def run_playbook(argv: list[str], *, capture: bool) -> progress.Timed:
    """A play from the checkout's ansible/ (its ansible.cfg: the progress callback included). Captured,
    its output is kept with the time of every line: `.longest_silence` proves no silent minutes."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(checkout() / "ansible" / "ansible.cfg")}
    if capture:
        return progress.timed_run(argv, cwd=checkout() / "ansible", env=env)
    done = subprocess.run(argv, cwd=checkout() / "ansible", env=env)  # on the terminal, Ansible's colours kept
    return progress.Timed(done.returncode, "", "", lines=None)  # no line times: .longest_silence refuses


def task_events(output: str) -> list[tuple[str, str, str]]:
    """(task, status, host) for each host's result line in a play's output (the default callback's),
    in order, handlers included: status is ok, changed, skipping, failed or fatal; a delegated task's
    line (`changed: [host -> front]`) names the host it ran for."""
    events, task = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
            continue
        status, _, rest = line.partition(": [")
        if status in ("ok", "changed", "skipping", "failed", "fatal") and rest:
            host = rest.split("]", 1)[0].split(" -> ", 1)[0]
            events.append((task, status, host))
    return events


def changed_tasks(output: str) -> list[str]:
    """Names of the tasks a play's output reports as changed (handlers included), in order."""
    return [task for task, status, _ in task_events(output) if status == "changed"]


def gate_report(target: hosts.Host, run_id: str, state: Path | None = None) -> dict[str, Any] | None:
    """Run `run_id`'s gate report, read from the host; None when the play never reached the gate."""
    path = layout.HostLayout.of(state=state).gate_report(run_id)
    done = target.ssh(f"cat {path}", check=False)
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None


def _follow_fixture_pins(path: Path, profile: Profile) -> None:
    """The rehearsal pins the hub's commits of fixtures generated here: when the fixtures change,
    so do the pins, a deliberate bump by construction — `lock update` it, as a site would."""
    from specdeploy.profile import site_lock
    from specdeploy.profile.lock import Lock

    site = Lock(path)
    if site_lock.changed_pins(site, profile):
        plan = site_lock.plan_update(site, profile)
        site_lock.apply_update(site, profile, plan)
        print(f"lock update: the fixtures' pins moved ({', '.join(c.pin for c in plan.changed)})", file=sys.stderr)


@dataclass(frozen=True)
class Prepared:
    wheels: Path
    host: hosts.Host
    site: Any  # registry.Registry
    base: tuple[str, str]  # the engine image's base in the site registry: (name, digest)


def prepare(profile: Profile, repos: list[str], *, site_lock: Path) -> Prepared:
    """What the play needs from this machine and nothing orders, made at once (issue 34: the main job
    within 15 min on a fresh machine; made one after the other they took about 8 min there): the
    wheelhouse (downloads), the host (its image debootstrapped, then booted), the registry, the hub's
    image and the engine image's base (each debootstrapped) and the hub's models (`repos`: the real
    model's conversion). The engine image is built as soon as its inputs are (the wheelhouse, the
    registry, the base pushed there): it does not depend on the models' commits, so `build_once` later
    finds it built (the same build key) and only pushes it. Each is reused when made before, and says
    when it is done and how long it took; the first failure is raised once all have ended."""
    from specdeploy.rehearsal import engine_image, hub, registry

    hub.ensure_network()  # once, before the steps that join it
    steps: dict[str, Callable[[], Any]] = {
        "wheelhouse": lambda: wheelhouse(PROFILE),
        "rehearsal host": host,
        "registry": registry.start_registry,
        "hub image": hub.hub_image,
        "engine base image": lambda: engine_image.base_image(profile),
        "models": lambda: hub.mirror_fixtures(hub.mirrors(), repos),
    }
    futures: dict[str, Future[Any]] = {}

    def engine_image_built() -> tuple[str, str]:  # submitted last: its inputs' futures exist by then
        progress.observe("waiting for its inputs: the wheelhouse, the registry and the engine base image")
        wheels, site = futures["wheelhouse"].result(), futures["registry"].result()
        futures["engine base image"].result()
        progress.observe(f"pushing the engine base image to {site.address}")
        base = engine_image.base_in_registry(profile, registry=site.address, cert_dir=site.cert_dir)
        pinned = variants.derive(profile, profile.name, _base_patch(base))
        key = engine_image.archive_key(pinned, context=checkout(), wheels=wheels)
        engine_image.build_on_controller(
            pinned, context=checkout(), wheels=wheels, lock=_builder_lock(site_lock, key), cert_dir=site.cert_dir
        )
        return base

    steps["engine image"] = engine_image_built

    def timed(name: str, step: Callable[[], Any]) -> Any:
        # a line every 20 s while it runs, naming what its program last printed (no silent minutes)
        with progress.step(f"prepare: {name}"):
            return step()

    with ThreadPoolExecutor(max_workers=len(steps), thread_name_prefix="prepare") as pool:
        for name, step in steps.items():
            futures[name] = pool.submit(timed, name, step)
        wait(futures.values())
    for future in futures.values():
        if (error := future.exception()) is not None:
            raise error
    return Prepared(
        futures["wheelhouse"].result(),
        futures["rehearsal host"].result(),
        futures["registry"].result(),
        futures["engine image"].result(),
    )


@dataclass
class MainJob:
    run_id: str
    playbook_exit: int
    report: dict[str, Any] | None


def main_job(*, remove_host: bool = False, patch: dict[str, Any] | None = None) -> MainJob:
    """Deploy cpu-rehearsal-smollm2 to the disposable host (booted when missing) with its weights
    from the gated hub, and read this run's gate report. `patch`: deploy a variant of the profile
    instead (benchmarks/rehearsal_deploy.py deploys one whose gate fails, to time a rollback)."""
    from specdeploy.rehearsal import hub

    check_controller()
    profile = load_profile(PROFILE)
    repos = [model.repo for _, model in models_of(profile)]
    state = cache_dir() / "rehearsal-host"
    prepared = prepare(profile, repos, site_lock=state / SITE_LOCK)
    wheels, target, site = prepared.wheels, prepared.host, prepared.site
    (state / "secrets.json").unlink(missing_ok=True)  # the plain vars file of earlier versions
    kept = rehearsal_vault(state / "secrets")
    token = kept.values()["weights_hf_token"]
    gated = [model.repo for _, model in models_of(profile) if model.gated]
    with hub.hub(token=token, gated=gated, repos=repos) as served:
        profiles = pinned_profile(profile, served.commits, state / "profiles", base=prepared.base).parent
        if patch:
            variant = variants.derive(load_profile(profiles / f"{PROFILE}.yaml"), PROFILE, patch)
            profiles = variants.materialize(variant, state / "profiles-variant").parent
        deployed = load_profile(profiles / f"{PROFILE}.yaml")
        _follow_fixture_pins(state / SITE_LOCK, deployed)
        build_once(deployed, wheels=wheels, site=site, site_lock=state / SITE_LOCK)
        run_id = keeper.new_run_id()
        argv = playbook_argv(
            target,
            state / "inventory.ini",
            wheels=wheels,
            archive=None,
            run_id=run_id,
            profile=PROFILE,
            profiles=profiles,
            extra_vars={
                "weights_source": "hub",
                "weights_hf_endpoint": served.endpoint_in_network,
                "weights_hf_ca_src": str(served.ca),  # the hub is https://, its certificate the site CA's
                # build once, pull by digest: the image built and pushed above, the site CA trusted
                "images_source": "pull",
                "images_registry": site.address,
                "images_registry_ca_src": str(site.ca),
            },
            vault=kept,
        )
        print(f"ansible-playbook deploy.yml -l rehearsal (profile {PROFILE}, run {run_id})", file=sys.stderr)
        played = run_playbook(argv, capture=False)
    report = gate_report(target, run_id)
    if remove_host:
        hosts.stop(target.name)
    return MainJob(run_id, played.returncode, report)
