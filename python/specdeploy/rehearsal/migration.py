"""The migration rehearsal: `specdeploy migrate` run end to end on disposable test hosts
(docs/rehearsal.md "Rehearsing a host move"; tests/integration/test_migration.py runs the same functions).

Three hosts on the hub's test network, besides the hub and the site registry:

| host | what | address |
|---|---|---|
| OLD | the container rehearsal host, deployed (the main job's, or the integration tests') | its own |
| NEW | a second trixie host of the same image, running podman itself; empty at first | NEW_IP |
| FRONT | a bookworm host with Debian's HAProxy: the site's front door (deploy.yml's front play) | FRONT_IP |

Each engine host's engine listens on its loopback only; its listener (HAProxy, mutual TLS) takes its
internal address for the front alone, with a certificate the rehearsal's site CA issues (as it issues
the front's client certificate): `hop_certificates`.

The front's port (the profile's `front.listen_port`) is published on the controller's loopback,
where a load client stands; its certificate is a site certificate made here (self-signed, for
127.0.0.1 and the front's address), which the client trusts. The inventory (`site.ini`) sits in the
site directory beside the site's lock and vault, as a site keeps them; NEW is rendered into the
front in maint (`front_server_state`), so no request reaches it before `migrate cutover`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdeploy.core import atomic, progress
from specdeploy.core.errors import SpecdeployError
from specdeploy.core.programs import ansible_program
from specdeploy.rehearsal import hosts

if TYPE_CHECKING:
    from specdeploy.migrate.load import LoadResult, LoadSpec
    from specdeploy.profile import Profile

NEW_NAME, NEW_SSH, NEW_IP = "specdeploy-container-new", 2341, "10.89.64.31"
FRONT_NAME, FRONT_SSH, FRONT_IP = "specdeploy-front", 2342, "10.89.64.32"
INVENTORY = "site.ini"
# The main job's move (`specdeploy rehearsal migrate`): its own NEW beside the main job's host, the
# same front host as the tests' (one front at a time publishes the loopback port).
MAIN_NEW_NAME, MAIN_NEW_SSH, MAIN_NEW_IP = "specdeploy-rehearsal-new", 2321, "10.89.64.21"


def front_certificate(directory: Path, addresses: tuple[str, ...]) -> Path:
    """The site's certificate for the front: one PEM file holding the certificate and its key, as
    HAProxy's `crt` reads it (0600); self-signed, so the load client trusts the file itself."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    pem = directory / "front-site.pem"
    if pem.is_file():
        return pem
    now = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specdeploy rehearsal front")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    encoding = serialization.Encoding.PEM
    data = certificate.public_bytes(encoding) + key.private_bytes(
        encoding, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    atomic.ensure_dir(directory)
    atomic.write_bytes(pem, data, mode=0o600)
    return pem


@dataclass(frozen=True)
class HopCertificates:
    """The front-to-engine hop's certificates (docs/front.md, "The exposure model"), all from the
    rehearsal's site CA (the one the registry and the hub use): the CA, the front's client
    certificate and each engine host's listener certificate (naming the host by its inventory name),
    each PEM bundle (certificate and key) mode 0600."""

    ca: Path
    client: Path
    listeners: dict[str, Path]


def hop_certificates(directory: Path, engines: dict[str, str], *, client_name: str) -> HopCertificates:
    """Issue (or reuse) the hop's certificates for `engines` (inventory name -> internal address)."""
    from specdeploy.rehearsal import site_ca

    tls = directory / "hop-tls"
    client = site_ca.issue(tls / "front-client", ips=[], dns=[client_name], client=True)
    listeners = {
        name: site_ca.pem_bundle(
            site_ca.issue(tls / f"listener-{name}", ips=[ip], dns=[name]), tls / f"listener-{name}.pem"
        )
        for name, ip in engines.items()
    }
    return HopCertificates(client.ca, site_ca.pem_bundle(client, tls / "front-client.pem"), listeners)


def write_inventory(
    directory: Path,
    *,
    old: hosts.Host,
    old_ip: str,
    new: hosts.Host,
    front: hosts.Host,
    profile: str,
    cert: Path,
    old_vars: tuple[str, ...] = (),
    new_ip: str = NEW_IP,
) -> Path:
    """The site's inventory of the three hosts: both engine hosts serving the front on their internal
    address (their listener, with its certificate from the site CA), NEW rendered in maint, the
    front's settings (its site certificate, its client certificate for the listeners)."""
    from specdeploy.profile import load_profile

    client_name = load_profile(profile).front.client_name
    tls = hop_certificates(directory, {old.name: old_ip, new.name: new_ip}, client_name=client_name)

    def line(host: hosts.Host, ip: str | None, *variables: str) -> str:
        address = (
            (
                f"specdeploy_publish_host={ip}", f"specdeploy_internal_address={ip}",
                f"front_listener_cert_src={tls.listeners[host.name]}", f"front_listener_ca_src={tls.ca}",
                "front_listener_install_haproxy=false",
            )
            if ip
            else ()
        )  # fmt: skip
        return " ".join([host.inventory_line(), *address, *variables])

    inventory = directory / INVENTORY
    inventory.write_text(
        "[rehearsal]\n"
        f"{line(old, old_ip, *old_vars)}\n"
        f"{line(new, new_ip, 'front_server_state=maint')}\n"
        "[specdeploy_engines:children]\nrehearsal\n"
        f"[specdeploy_front]\n{line(front, None)}\n"
        f"[specdeploy_front:vars]\nfront_profile={profile}\nfront_cert_src={cert}\nfront_install_haproxy=false\n"
        f"front_client_cert_src={tls.client}\nfront_engine_ca_src={tls.ca}\n"
    )
    return inventory


def start_hosts(
    directory: Path, network: str, *, new: tuple[str, int, str] = (NEW_NAME, NEW_SSH, NEW_IP)
) -> tuple[hosts.Host, hosts.Host]:
    """NEW (`new`: name, ssh port, address) and FRONT, reused when they run from the current
    images, booted otherwise."""
    from specdeploy.profile import load_profile
    from specdeploy.rehearsal.deploy import PROFILE

    port = load_profile(PROFILE).front.listen_port
    found = []
    for name, ssh, ip, image, options in (
        (*new, hosts.host_image(), {"containers": True}),
        # Debian's haproxy.service binds /dev/log into a mount namespace, which an unprivileged test
        # container cannot make (226/NAMESPACE); a real host can
        (FRONT_NAME, FRONT_SSH, FRONT_IP, hosts.front_host_image(), {"ports": (port,), "privileged": True}),
    ):
        running = hosts.running(name, ssh, directory / f"{name}_ed25519", image)
        if running is None:
            print(f"booting the test host {name} (ssh on 127.0.0.1:{ssh})", file=sys.stderr)
            running = hosts.start(name, ssh, directory, image=image, network=hosts.Network(network, ip), **options)
        found.append(running)
    return found[0], found[1]


def site_deploy_args(*, wheels: Path, registry: str, ca: Path, hub_endpoint: str | None) -> list[str]:
    """The site's own `-e` for deploy.yml, as its deploys pass them: the wheelhouse, the image by
    digest from the site registry (trusted through its CA), the hub (where weights are fetched)."""
    values = {
        "specdeploy_wheelhouse_src": str(wheels),
        "images_registry": registry,
        "images_registry_ca_src": str(ca),
        "images_source": "pull",
    } | ({"weights_hf_endpoint": hub_endpoint, "weights_hf_ca_src": str(ca)} if hub_endpoint else {})
    return [a for key, value in values.items() for a in ("-e", f"{key}={value}")]


# the steps that run deploy.yml (plan: NEW's preflight; prepare: NEW's deploy) take the site's arguments
DEPLOYING = ("plan", "prepare")


@dataclass
class Move:
    """The three hosts and how to run a migration step between the two engine hosts."""

    inventory: Path
    old: hosts.Host
    new: hosts.Host
    front: hosts.Host
    vault_password_file: Path
    deploy_args: list[str]
    logs: Path
    # the longest stretch without a line of output of each `migrate` step run (issue 37: none over 30 s)
    silences: dict[str, float] = field(default_factory=dict, init=False)  # the longest over its runs

    def command_line(self, step: str, *extra: str) -> list[str]:
        argv = [
            str(Path(sys.executable).parent / "specdeploy"), "migrate", step,
            "--from", self.old.name, "--to", self.new.name, "-i", str(self.inventory), "--front", self.front.name,
            "--vault-password-file", str(self.vault_password_file), "--json", *extra,
        ]  # fmt: skip
        return [*argv, "--", *self.deploy_args] if step in DEPLOYING else argv

    def play(self, limit: str, *extra: str, profile: str, profiles: Path, capture: bool = True) -> progress.Timed:
        """deploy.yml as the site runs it: its inventory, vault and own arguments, `profile` pinned in
        `profiles`; a captured run's output is kept in `logs`."""
        from specdeploy.rehearsal import deploy

        argv = [
            str(ansible_program("ansible-playbook", why="the rehearsal's hosts cannot be deployed")), "deploy.yml",
            "-i", str(self.inventory), "-l", limit, "--vault-password-file", str(self.vault_password_file),
            "-e", f"specdeploy_profile={profile}", "-e", f"specdeploy_profiles_src={profiles}",
            *self.deploy_args, *extra,
        ]  # fmt: skip
        run = deploy.run_playbook(argv, capture=capture)
        if capture:
            self.logs.mkdir(parents=True, exist_ok=True)
            (self.logs / f"play-{limit}-{int(time.time())}.log").write_text(run.stdout + run.stderr)
        return run

    def step(self, step: str, *extra: str) -> tuple[int, dict[str, Any]]:
        """`specdeploy migrate STEP` as a person runs it (its output kept in `logs`): (exit code, its JSON
        with `stderr` and this run's `longest_silence_s` added)."""
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        # its messages and progress lines shown as they come (stdout is its JSON, kept for the rows)
        done = progress.timed_run(
            self.command_line(step, *extra), env=env, timeout=3600, echo=sys.stderr, echo_stdout=False
        )
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.logs / f"migrate-{step}.log").write_text(done.stdout + done.stderr)
        self.silences[step] = max(self.silences.get(step, 0.0), done.longest_silence)
        try:
            data = json.loads(done.stdout) if done.stdout.strip() else {}
        except json.JSONDecodeError:
            data = {"stdout": done.stdout[-2000:]}
        return done.returncode, data | {"stderr": done.stderr, "longest_silence_s": done.longest_silence}

    def front_status(self) -> dict[str, dict[str, Any]]:
        from specdeploy.core import layout

        cli = layout.InstallLayout().to_json()["cli"]
        shown = self.front.ssh(f"{cli} front status --json")
        return {s["name"]: s for s in json.loads(shown.stdout)["servers"]}

    def record(self) -> dict[str, Any]:
        where = self.inventory.parent / "migrations" / f"{self.old.name}--{self.new.name}.json"
        return json.loads(where.read_text())

    def finish_after_soak(self, soak_s: float) -> tuple[int, dict[str, Any]]:
        """`migrate finish --stop-old` once NEW has served `soak_s` since the cutover. First one light
        gate on NEW closes the load's interval, as the host's timer would during a soak: finish's
        own light gate judges acceptance since the last one, and the load's long forced streams on
        fixture models trained on short answers give an artifact of a figure (1.2–1.4 against ~3.4
        over the smoke's prompts) that the light gate rightly calls a collapse."""
        from specdeploy.core import layout

        cli = layout.InstallLayout().to_json()["cli"]
        with progress.step(f"{self.new.name}: a light gate closes the load's interval") as light:
            light.observe(f"ssh {self.new.name} {cli} watch run --json")
            closed = self.new.ssh(f"{cli} watch run --json", check=False)
        if closed.returncode not in (0, 1):
            raise SpecdeployError(
                f"{self.new.name}: the light gate could not run (exit {closed.returncode}): "
                + (closed.stderr.strip() or closed.stdout.strip())[-500:],
                hint=f"see `{cli} watch run` on {self.new.name}",
            )
        cutover = self.record()["steps"]["cutover"]["details"]["finished_unix"]
        with progress.step(f"soak: NEW serves {soak_s:g} s after the cutover before finish") as soak:
            soak.observe(
                f"cutover at {time.strftime('%H:%M:%S', time.localtime(cutover))}; light gate: {closed.returncode}"
            )
            time.sleep(max(0.0, soak_s - (time.time() - cutover)))
        return self.step("finish", "--stop-old")

    def under_load(self, step: str, spec: LoadSpec, *extra: str) -> tuple[int, dict[str, Any], LoadResult]:
        """`specdeploy migrate STEP` while a bounded streaming load goes through the front: the step
        starts once LOAD_BEFORE requests are streaming (not only sent: still connecting, they would not be
        in flight on the host the step drains); when it ends, the load sends no more (at most
        `total` in all) and the requests in flight finish. The load spans the whole step, and no
        request is sent after it (a loaded move waited ~85 s for the rest of 24 requests)."""
        from specdeploy.migrate.load import Load

        with Load(spec) as running:
            if not running.wait_streaming(LOAD_BEFORE, 120):
                raise SpecdeployError(
                    f"the load through the front had not {LOAD_BEFORE} requests streaming within 120 s "
                    f"({running.result.sent} sent): {step} not started",
                    hint=f"is the front's port open on the controller? ({spec.url})",
                )
            code, out = self.step(step, *extra)
            result = running.stop()
        return code, out, result


STEPS = ("plan", "prepare", "verify", "cutover")
LOADED = frozenset({"cutover", "rollback"})  # the steps that move traffic: run under load
LOAD_BEFORE = 3  # requests streaming through the front before a loaded step starts
# Sixteen streams at a time, 343 to 448 tokens long by slot (the profile's max_model_len is 512; the
# load's `tokens_for`). A stream is in flight at the front only while its engine decodes it (HAProxy
# buffers the rest for a client that reads late): 3-5 s each when the engines have the machine to
# themselves, ~12 s on a busy one. With leastconn, a drain right after NEW came in meets about half
# of them still on the host it drains — as long as the load is still sending.
LOAD_IN_FLIGHT, LOAD_TOKENS = 16, 448
# A loaded step's load stops sending when the step ends; this only bounds it. A step's own CLI took
# ~35 s to reach its drain on a loaded VM (its SSH sessions and CLI starts on the controller and the
# front): a load of 48, later 96 requests had all been sent and answered by then, and the drain found
# nothing in flight (the chain's assertion names that case on its own).
LOAD_MAX_REQUESTS = 2000
# The main job's move (`rehearsal migrate`) serves the real model, far slower per token on the CPU than the
# fixtures: with the load above, OLD still had 8 streams in flight 97 s into the cutover's drain, which ran out
# of the profile's 120 s (migration.drain_timeout_s) in one of two runs (2026-12-06, benchmarks/silences.py;
# the other drained in 104 s). Shorter streams, fewer at a time, still outlast a step's start to its drain
# and end well within it.
MAIN_JOB_LOAD_IN_FLIGHT, MAIN_JOB_LOAD_TOKENS = 8, 128


def load_spec(
    profile: Profile,
    *,
    api_key: str,
    ca_file: Path,
    total: int,
    in_flight: int = LOAD_IN_FLIGHT,
    max_tokens: int = LOAD_TOKENS,
) -> LoadSpec:
    """The rehearsal's load through the front: `total` streaming chat requests, `in_flight` at a time,
    a generous client timeout; the front's certificate trusted from its file."""
    from specdeploy.migrate.load import LoadSpec

    return LoadSpec(
        url=f"https://127.0.0.1:{profile.front.listen_port}", api_key=api_key,
        model=profile.engine.serve.served_model_name or profile.target.repo, total=total,
        in_flight=in_flight, max_tokens=max_tokens, timeout_s=300, ca_file=str(ca_file),
    )  # fmt: skip


def run_steps(move: Move, steps: tuple[str, ...], spec: LoadSpec) -> list[dict[str, Any]]:
    """Each step in turn as `specdeploy migrate STEP` (its command printed first; the LOADED ones
    under `spec`'s load), up to the first that fails: one row per step run (step, exit, summary, its
    longest stretch without a line of output, and the load's counts where it ran)."""
    rows = []
    for step in steps:
        print("$ " + " ".join(move.command_line(step)[1:]), file=sys.stderr)
        if step in LOADED:
            code, out, result = move.under_load(step, spec)
            out["load"] = result.to_json()
        else:
            code, out = move.step(step)
        rows.append(_row(step, code, out))
        if code != 0:
            break
    return rows


def _row(step: str, code: int, out: dict[str, Any]) -> dict[str, Any]:
    """A step run's row: step, exit, summary (else its stderr's end), its longest silence, its load."""
    summary = out.get("summary") or out["stderr"].strip()[-300:]
    row = {"step": step, "exit": code, "summary": summary, "longest_silence_s": round(out["longest_silence_s"], 1)}
    return row | ({"load": out["load"]} if "load" in out else {})


def moved(rows: list[dict[str, Any]]) -> bool:
    """Whether the rows are a move done: every step of STEPS ran and passed (and a finish after them,
    where one ran), and no request of a load failed."""
    passed = [r["step"] for r in rows if r["exit"] == 0]
    return (
        passed in (list(STEPS), [*STEPS, "finish"])
        and len(passed) == len(rows)
        and all(r.get("load", {}).get("failed", 0) == 0 for r in rows)
    )


def main_job_move(*, requests: int | None = None, finish: bool = False) -> list[dict[str, Any]]:
    """docs/rehearsal.md "Rehearsing a host move": the main job's deployment (OLD, deployed by the main job first)
    moved to a new host through the front, as a site would: NEW and FRONT booted (or reused), the
    front deployed and OLD re-deployed behind it (publishing on its internal address), then
    `specdeploy migrate plan`, `prepare`, `verify` and `cutover` — the last under a bounded streaming
    load through the front (`requests` at most, by default LOAD_MAX_REQUESTS: it stops when the step ends). Each
    command is printed before it runs; returns one row per step."""
    from specdeploy.migrate import record
    from specdeploy.profile import load_profile
    from specdeploy.rehearsal import deploy, hub, registry

    job = deploy.main_job()
    if job.report is None or job.report.get("verdict") != "pass":
        raise SpecdeployError(
            "the main job's deploy did not pass its gate: there is no OLD to move",
            hint="run ./scripts/rehearse.sh and fix what its gate report says",
        )
    state = deploy.cache_dir() / "rehearsal-host"
    old = deploy.host()
    new, front = start_hosts(state, hub.NETWORK, new=(MAIN_NEW_NAME, MAIN_NEW_SSH, MAIN_NEW_IP))
    cert = front_certificate(state, ("127.0.0.1", FRONT_IP))
    inventory = write_inventory(
        state, old=old, old_ip=deploy.HOST_IP, new=new, front=front, profile=deploy.PROFILE, cert=cert,
        new_ip=MAIN_NEW_IP,
    )  # fmt: skip
    # a move of its own: an earlier run's record (traffic on NEW, or finished) would refuse its plan
    earlier = record.path(state, old.name, new.name)
    if earlier.exists():
        kept = earlier.with_name(f"{earlier.stem}.{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json")
        earlier.rename(kept)
        print(f"the earlier run's migration record kept as {kept}", file=sys.stderr)
    site = registry.start_registry()
    vault = deploy.rehearsal_vault(state / "secrets")
    # OLD keeps its verified weights (present); the image by digest from the site registry
    args = site_deploy_args(
        wheels=deploy.wheelhouse(deploy.PROFILE), registry=site.address, ca=site.ca, hub_endpoint=None
    )
    move = Move(
        inventory, old, new, front, vault.password_file, [*args, "-e", "weights_source=present"], state / "logs"
    )
    profiles = state / "profiles"
    for limit in (front.name, old.name):
        print(f"$ ansible-playbook deploy.yml -i {inventory} -l {limit} ...", file=sys.stderr)
        if move.play(limit, profile=deploy.PROFILE, profiles=profiles, capture=False).returncode != 0:
            raise SpecdeployError(f"deploy.yml -l {limit} failed: nothing was moved", hint="see its output above")
    profile = load_profile(profiles / f"{deploy.PROFILE}.yaml")
    spec = load_spec(
        profile, api_key=vault.values()["engine_api_key"], ca_file=cert, total=requests or LOAD_MAX_REQUESTS,
        in_flight=MAIN_JOB_LOAD_IN_FLIGHT, max_tokens=MAIN_JOB_LOAD_TOKENS,
    )  # fmt: skip
    rows = run_steps(move, STEPS, spec)
    if finish and moved(rows):
        print(f"$ {' '.join(move.command_line('finish', '--stop-old')[1:])}  (after the soak)", file=sys.stderr)
        code, out = move.finish_after_soak(profile.migration.soak_s)
        rows.append(_row("finish", code, out))
    return rows
