"""The runbook's steps: plan, prepare, verify, cutover, rollback, finish (docs/migration.md).

Each step is a function of a `Migration` (the two hosts, the front, the site's deploy arguments)
and the migration record (migrate.record); each checks its own preconditions, does its work,
checks the result and records it — whatever the outcome — so a step can be re-run after a fix
and an interrupted one resumed. Traffic reaches NEW only in `cutover`, and only after `verify`
passed; `rollback` puts it back on OLD from any step.

| step | on OLD | on NEW | on the front |
|---|---|---|---|
| plan | its verified gate report, golden, profile; its identity now | reachable | both servers known |
| prepare | streams the weights' files | weights seeded and verified, OLD's golden, `deploy.yml` | NEW out (maint) |
| verify | — | the gate, then its report compared with OLD's (migrate.compare) | — |
| cutover | drained, then out | in | NEW ready, OLD drained, OLD maint |
| rollback | back in | drained, out | OLD ready, NEW drained, NEW maint |
| finish | out of service (decommission.yml; weights and state kept) | its light gate passes | — |

Commands on the hosts are the host CLI's (the specdeploy role installs it), run through Fabric as
the inventory's user; secrets never travel: the hosts read their own key files.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, keeper, layout, progress
from specdeploy.core.errors import SpecdeployError
from specdeploy.core.programs import ansible_program
from specdeploy.core.sizes import human
from specdeploy.front.config import backup_name
from specdeploy.migrate import compare, record, seed
from specdeploy.migrate.hosts import HostAccess, connect
from specdeploy.profile import Profile, load_profile, site_lock
from specdeploy.profile.lock import Lock
from specdeploy.weights.fetch import models_of

CLI = layout.InstallLayout().to_json()["cli"]
PATH_VARS = {
    "models": "specdeploy_models_dir",
    "serving": "specdeploy_serving_dir",
    "state": "specdeploy_state_dir",
    "cache": "specdeploy_cache_dir",
}


class StepError(SpecdeployError):
    """A step found something wrong: nothing past it ran, traffic stays where the record says."""

    exit_code = 1


@dataclass
class Migration:
    site: Path  # the site directory: the inventory's, holding the lock and migrations/
    inventory: Path
    old: HostAccess
    new: HostAccess
    front: HostAccess | None = None
    # the site's other front hosts (two HAProxies behind one address): every move is made on each
    other_fronts: list[HostAccess] = field(default_factory=list)
    front_socket: str | None = None  # HAProxy's runtime socket on the front host (None: the front's default)
    front_hook: str | None = None  # or the site's own balancer: its hook on the front host (docs/front.md)
    vault_password_file: Path | None = None
    deploy_args: list[str] = field(default_factory=list)  # the site's own -e ... for deploy.yml
    playbook_dir: Path | None = None
    progress: Callable[[str], None] = lambda message: None
    _connections: dict[str, Any] = field(default_factory=dict)

    @property
    def fronts(self) -> list[HostAccess]:
        """Every front host, the first one (--front's first) first; none without a front."""
        return [self.front, *self.other_fronts] if self.front is not None else []

    @property
    def lock_path(self) -> Path:
        return self.site / "specdeploy.lock"

    @property
    def workdir(self) -> Path:
        """What plan keeps on the controller for this move (OLD's profile copy, its reports)."""
        return self.site / "migrations" / f"{self.old.name}--{self.new.name}"

    def conn(self, host: HostAccess) -> Any:
        if host.name not in self._connections:
            self._connections[host.name] = connect(host)
        return self._connections[host.name]

    def layout(self, host: HostAccess) -> layout.HostLayout:
        """The host's state layout from its inventory variables (read with its access)."""
        return layout.HostLayout.of(**{r: host.variables.get(v) for r, v in PATH_VARS.items()})

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()


# --------------------------------------------------------------------------- helpers


def run(m: Migration, host: HostAccess, argv: list[str], *, what: str, ok_codes: tuple[int, ...] = (0,)) -> Any:
    """One command on a host (argv quoted; never a secret), its result; a StepError naming the host,
    the command and its last line of output when its exit code is not in `ok_codes`."""
    command = " ".join(shlex.quote(a) for a in argv)
    try:
        # a line every 20 s while it runs (a gate, an image's save: minutes), naming its last output line
        with progress.step(f"{host.name}: {what}", announce=False) as step:
            done = m.conn(host).run(command, hide=True, warn=True, in_stream=False, watchers=[_Observer(step)])
    except Exception as exc:  # paramiko/socket errors: the host cannot be reached
        raise StepError(
            f"{host.name} ({host.address}:{host.port}): cannot run {what}: {type(exc).__name__}: {exc}",
            hint="check the host is up and the inventory's ssh settings (`ansible -i INVENTORY -m ping HOST`)",
        ) from None
    if done.exited not in ok_codes:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        raise StepError(
            f"{host.name}: {what} exited {done.exited}: {' / '.join(last) or '(no output)'}",
            hint=f"run it on {host.name} by hand to see all of it: {command}",
        )
    return done


class _Observer:
    """An invoke stream watcher: each new output line of a remote command becomes its step's observation."""

    def __init__(self, step: progress.Step) -> None:
        self.step = step

    def submit(self, stream: str) -> list[str]:
        lines = stream[-1000:].splitlines()  # invoke hands the whole output so far: its end is enough
        if lines:
            self.step.observe(lines[-1])
        return []  # nothing to answer: stdin is closed


def _play(m: Migration, argv: list[str], playbook_dir: Path, log: Path, what: str) -> int:
    """Run a play into `log`, its exit code; while it runs a line every 20 s names the task it is in
    and the last line it wrote (`migrate prepare` sat silent for nine minutes before)."""
    m.progress(f"{what} (log: {log})")
    with log.open("w") as sink, progress.step(what), progress.follow(log, pick=_play_line):
        return subprocess.run(argv, cwd=playbook_dir, stdout=sink, stderr=subprocess.STDOUT, check=False).returncode


def _play_line(text: str) -> str | None:
    """A line of a play's log worth showing: not blank, not a row of stars."""
    return text.rstrip("* ").strip() or None


def read_json_file(m: Migration, host: HostAccess, path: str, *, what: str) -> dict[str, Any] | None:
    done = run(m, host, ["cat", "--", path], what=f"reading {what}", ok_codes=(0, 1))
    if done.exited != 0:
        return None
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise StepError(f"{host.name}: {what} {path} is not JSON", hint="inspect the file on the host") from None
    return data if isinstance(data, dict) else None


def front_door(m: Migration) -> list[str]:
    """How `specdeploy front` on the front host reaches the balancer: the site's hook, or HAProxy's
    runtime socket (the given one, else the front's own default)."""
    if m.front_hook is not None:
        return ["--hook", m.front_hook]
    return ["--socket", m.front_socket] if m.front_socket is not None else []


def front_command(m: Migration, verb: str, server: str, *extra: str, front: HostAccess | None = None) -> dict[str, Any]:
    """`specdeploy front VERB SERVER` on a front host (`front`, default the first), through its
    runtime socket or the site's hook."""
    front = front or m.front
    if front is None:
        raise StepError(
            "no front host: cutover and rollback move traffic through the site's front door",
            hint="pass --front HOST (the inventory's HAProxy host; docs/front.md)",
        )
    argv = [CLI, "front", verb, *([server] if server else []), *front_door(m), *extra, "--json"]
    done = run(m, front, argv, what=f"`specdeploy front {verb} {server}`".replace("  ", " "))
    return json.loads(done.stdout) if done.stdout.strip() else {}


def front_servers(m: Migration, front: HostAccess | None = None) -> dict[str, dict[str, Any]]:
    shown = front_command(m, "status", "", front=front)
    return {s["name"]: s for s in shown.get("servers", [])}


def revisions_served(profile: Profile, report: dict[str, Any], models: Path) -> dict[str, str]:
    """role -> revision, from the `served` paths of a passing gate report."""
    found: dict[str, str] = {}
    for role, ref in models_of(profile):
        prefix = (models / ref.repo).as_posix() + "/"
        for path in report.get("served") or []:
            if str(path).startswith(prefix):
                found[role] = str(path)[len(prefix) :].split("/", 1)[0]
    return found


def _deploy(
    m: Migration, host: HostAccess, profile: Profile, profiles_dir: Path, extra: dict[str, str], tags: str = ""
) -> int:
    """`ansible-playbook deploy.yml -l HOST` with the site's arguments and OLD's profile copy (only
    the stages of `tags` when given)."""
    playbook_dir = m.playbook_dir or Path(__file__).resolve().parents[3] / "ansible"
    playbook = str(ansible_program("ansible-playbook", why=f"{host.name} cannot be deployed"))
    argv = [playbook, "deploy.yml", "-i", str(m.inventory), "-l", host.name, *(["--tags", tags] if tags else [])]
    if m.vault_password_file is not None:
        argv += ["--vault-password-file", str(m.vault_password_file)]
    argv += m.deploy_args  # the site's own, then the migration's (the later -e wins: OLD's profile, seeded weights)
    variables = {"specdeploy_profile": profile.name, "specdeploy_profiles_src": str(profiles_dir)} | extra
    for key, value in variables.items():
        argv += ["-e", f"{key}={value}"]
    log = m.workdir / f"deploy-{host.name}-{tags.replace(',', '-') or 'all'}-{int(time.time())}.log"
    return _play(m, argv, playbook_dir, log, f"deploy.yml -l {host.name}{' --tags ' + tags if tags else ''}")


# --------------------------------------------------------------------------- the steps


# On a host, no CLI needed (NEW may be bare): the free bytes of the filesystem that holds argv[1], or
# would hold it (its nearest existing parent).
FREE_BYTES = (
    "import os, shutil, sys\np = sys.argv[1]\nwhile not os.path.exists(p):\n    p = os.path.dirname(p)\n"
    "print(shutil.disk_usage(p).free)"
)
SPACE_MARGIN = 1.05  # the seed's partial files and the deploy's own writes


def space_problem(
    host: str, path: str, *, free: int, needed: int, what: str = "weights NEW lacks", fills: str = "NEW's disk"
) -> str | None:
    """Why `host` cannot take `needed` bytes at `path` (None: it can): the disk filling mid-copy is
    what plan exists to catch before a single byte moves (and, for an image saved on OLD, what would
    stop the engine serving there)."""
    if free >= needed * SPACE_MARGIN:
        return None
    return (
        f"{host}: {human(free)} free for {path}, expected at least {human(int(needed * SPACE_MARGIN))} "
        f"({human(needed)} of {what}, {SPACE_MARGIN - 1:.0%} margin): prepare would fill {fills}"
    )


def lock_problems(site: Lock, old: Lock | None, profile: Profile, *, old_name: str) -> list[str]:
    """Why the site's lock (what prepare deploys NEW with) would not give NEW what OLD serves (empty:
    it would): OLD's own lock (`<state>/specdeploy.lock`, the site's as OLD's last deploy pushed and
    merged it back) missing, the profile's pins moved in the site's lock since, or an entry of the
    profile OLD's lock holds that the site's lacks or holds with another value (a `lock update`
    since OLD's deploy included: NEW would resolve the new value, not the one OLD serves)."""
    if old is None:
        return [f"{old_name} has no lock in its state layout: nothing shows which pins it serves"]
    problems = [
        f"pin {c.pin}: OLD's profile has {c.profile!r}, the site's lock is now for {c.locked!r}"
        for c in site_lock.changed_pins(site, profile) or []
    ]
    for key, entry in sorted(old.data["profiles"].get(profile.name, {}).items()):
        mine = site.get(profile.name, key)
        if mine is None:
            problems.append(f"{profile.name}/{key}: OLD serves {entry['value']!r}, the site's lock has no entry")
        elif mine["value"] != entry["value"]:
            problems.append(
                f"{profile.name}/{key}: OLD serves {entry['value']!r}, the site's lock has {mine['value']!r}"
            )
    return problems


# deploy.yml's stages plan runs on NEW: the CLI (and the facts), then the preflight role with OLD's profile;
# nothing that can restart an engine or take traffic
PREFLIGHT_TAGS = "cli,preflight"


def preflight_new(m: Migration, profile: Profile, profiles_dir: Path) -> dict[str, Any]:
    """NEW checked against OLD's profile by deploy.yml's own preflight stage (the weights as prepare
    brings them: `present`); its report, kept on NEW, names each failed check in the StepError."""
    path = m.layout(m.new).preflight.as_posix()
    run(m, m.new, ["rm", "-f", "--", path], what="removing NEW's earlier preflight report")  # never read a stale one
    code = _deploy(m, m.new, profile, profiles_dir, {"weights_source": "present"}, tags=PREFLIGHT_TAGS)
    report = read_json_file(m, m.new, path, what="NEW's preflight report") or {}
    failed = [c for c in report.get("checks", []) if c.get("level") == "fail"]
    if code != 0 or failed:
        named = "; ".join(f"{c['name']}: {c['found']} (needs {c['expected']})" for c in failed)
        raise StepError(
            f"{m.new.name} cannot run {profile.name} (deploy.yml --tags {PREFLIGHT_TAGS} exited {code}): "
            f"{named or 'the play stopped before its preflight report'}; nothing was copied",
            hint=f"fix what it names on {m.new.name} (the play's log is in {m.workdir}), then plan again",
        )
    warned = [c["name"] for c in report.get("checks", []) if c.get("level") == "warn"]
    return {"passed": True, "warnings": warned, "report": path}


def plan(m: Migration, rec: record.MigrationRecord) -> dict[str, Any]:
    old_layout, new_layout = m.layout(m.old), m.layout(m.new)
    for host in (m.old, m.new):
        run(m, host, ["python3", "-c", "print('ok')"], what="a first command (reachable, Python present)")
    verified = old_layout.verified_gate_report.as_posix()
    report = read_json_file(m, m.old, verified, what="OLD's last verified gate report")
    if report is None or report.get("verdict") != "pass":
        raise StepError(
            f"{m.old.name}: no verified gate report at {verified}: OLD has no stack proven to serve, so there is "
            "nothing to move that NEW could be compared with",
            hint=f"deploy OLD first (`ansible-playbook deploy.yml -l {m.old.name}`), then plan again",
        )
    key = (report.get("golden") or {}).get("key")  # None: a verified run from before goldens
    golden_file = posixpath.join(old_layout.golden.as_posix(), f"{key}.json") if key else None
    has_golden = golden_file is not None and read_json_file(m, m.old, golden_file, what="OLD's golden") is not None
    identify = [CLI, "served-identity", "--profile", report["profile_file"], "--json"]
    if key is not None:
        serving = json.loads(run(m, m.old, identify, what="OLD's identity").stdout)
        if serving.get("key") != key:
            raise StepError(
                f"{m.old.name}: what it serves now (identity {serving.get('key')}) is not what its last verified "
                f"gate passed (identity {key}): the stack changed since its gate, so its report proves nothing",
                hint=f"re-deploy OLD so its gate covers what it serves (`ansible-playbook deploy.yml -l {m.old.name}`)",
            )
    recorded = None
    if not has_golden:  # record one from OLD first: its coherence prompts, one at a time
        m.progress(f"{m.old.name} has no golden transcript for its identity: recording one from its engine")
        serving = json.loads(run(m, m.old, [*identify, "--record-golden"], what="recording OLD's golden").stdout)
        key, recorded = serving["key"], serving["golden"]["path"]
        if not report.get("golden"):  # verify compares NEW with this identity and its golden
            report["golden"] = {"key": key, "identity": serving["identity"], "recorded_by": "migrate plan"}
    profile_text = run(m, m.old, ["cat", "--", report["profile_file"]], what="OLD's profile copy").stdout
    atomic.ensure_dir(m.workdir / "profiles")
    profile_path = m.workdir / "profiles" / Path(report["profile_file"]).name
    atomic.write_bytes(profile_path, profile_text.encode())
    atomic.write_json(m.workdir / "old-verified-gate.json", report)
    profile = load_profile(profile_path)
    rec.profile = profile.name
    lock = Lock(m.lock_path)
    old_lock = run(m, m.old, ["cat", "--", old_layout.lock.as_posix()], what="reading OLD's lock", ok_codes=(0, 1))
    held = (
        Lock.from_bytes(old_lock.stdout.encode(), f"{old_layout.lock} (host {m.old.name})")
        if old_lock.exited == 0
        else None
    )
    if problems := lock_problems(lock, held, profile, old_name=m.old.name):
        raise StepError(
            f"the site's lock {m.lock_path} would not give {m.new.name} what {m.old.name} serves: "
            f"{'; '.join(problems)}; nothing was copied",
            hint="plan with the site's lock OLD was last deployed with (the inventory's directory), or re-deploy OLD "
            "with the site's lock first so its gate covers those pins",
        )
    preflight = preflight_new(m, profile, profile_path.parent)
    revisions = revisions_served(profile, report, old_layout.models)
    items = seed.planned_files(profile, lock, old_layout.models.as_posix(), revisions)
    sizes = list(seed.iter_sizes(seed.FabricSide(m.conn(m.old), m.old.name), items))
    free = int(
        run(m, m.new, ["python3", "-c", FREE_BYTES, new_layout.models.as_posix()], what="NEW's free space").stdout
    )
    # NEW's preflight (above) checked the profile's declared needs (host.disk, in GiB); this checks the
    # bytes the seed will copy, by the lock's file list. What NEW lacks: a file already there at its full
    # size (a resumed prepare, a former OLD) takes no more
    on_new = seed.iter_sizes(seed.FabricSide(m.conn(m.new), m.new.name), items)
    missing = sum(size for size, there in zip(sizes, on_new, strict=True) if there != size)
    if problem := space_problem(m.new.name, new_layout.models.as_posix(), free=free, needed=missing):
        raise StepError(problem, hint="free space on NEW (or give its models directory a larger filesystem), then "
                        "plan again; nothing was copied")  # fmt: skip
    servers: dict[str, dict[str, Any]] = {}
    for front in m.fronts:  # every front host must know both: each gets every move
        servers = servers or front_servers(m, front)
        known = front_servers(m, front) if front is not m.front else servers
        for host in (m.old, m.new):
            if host.name not in known:
                raise StepError(
                    f"the front ({front.name}) has no server {host.name}: traffic could not be moved to or from it",
                    hint="add both hosts to the front's backends (the inventory's engine group) and re-run "
                    f"`ansible-playbook deploy.yml -l {front.name} --tags front`; NEW stays in maint until cutover",
                )
    return {
        "profile": profile.name,
        "old_report": report["run_id"],
        "identity_key": key,
        "golden_recorded": recorded,
        "revisions": revisions,
        "files": len(items),
        "bytes_to_copy": sum(sizes),
        "bytes_new_lacks": missing,  # what prepare will copy: a file NEW holds at its full size is only verified
        "models_old": old_layout.models.as_posix(),
        "models_new": new_layout.models.as_posix(),
        "front": {name: s.get("state") for name, s in servers.items()},
        "new_preflight": preflight,
        "expected_downtime": "none: NEW takes traffic before OLD is drained",
    }


# How NEW may get OLD's image: by digest from the site registry, or as an archive; never a rebuild.
IMAGE_SOURCES = ("pull", "archive")


def _extra_vars(deploy_args: list[str]) -> list[str]:
    """The values of every `-e`/`--extra-vars` among deploy.yml's arguments, in order."""
    found = []
    for i, arg in enumerate(deploy_args):
        if arg in ("-e", "--extra-vars") and i + 1 < len(deploy_args):
            found.append(deploy_args[i + 1])
        elif arg.startswith("--extra-vars="):
            found.append(arg.split("=", 1)[1])
        elif arg.startswith("-e") and len(arg) > 2 and not arg.startswith("--"):
            found.append(arg[2:])
    return found


def image_source(deploy_args: list[str], inventory_value: Any = None) -> str:
    """The images role's source for NEW: the site's `-e images_source=...` (the last one wins, as in
    Ansible), else the inventory's `images_source` for NEW, else `pull`. Prepare passes it explicitly.
    A rebuild is refused: it could differ from the image OLD serves; so is an `-e` naming
    images_source in a form this cannot read (a file, JSON), rather than guess what it says."""
    found = str(inventory_value) if inventory_value else "pull"
    for value in _extra_vars(deploy_args):
        if "images_source" not in value:
            continue
        if value.lstrip().startswith(("@", "{", "[")):
            raise StepError(
                f"deploy.yml arguments: -e {value[:80]}: names images_source in a form prepare does not read; "
                "nothing was copied",
                hint="pass it as -e images_source=pull (or =archive) on its own",
            )
        for pair in shlex.split(value):
            if pair.startswith("images_source="):
                found = pair.split("=", 1)[1]
    if found not in IMAGE_SOURCES:
        raise StepError(
            f"images_source={found} (the site's arguments or the inventory for NEW): prepare gives NEW OLD's "
            f"image, expected one of {', '.join(IMAGE_SOURCES)}; nothing was copied",
            hint="pass -e images_source=pull (the image by digest from the site registry, the default) or "
            "-e images_source=archive (the image's archive); a rebuild could differ from what OLD serves",
        )
    return found


def image_of_old(m: Migration, profile: Profile) -> dict[str, Any]:
    """`prepare --image-from-old`: the engine image OLD serves, saved there (`podman save`, once per
    image ID, beside OLD's state) and seeded to NEW's archive path like a weight file (streamed through
    the controller, verified by its sha256 on NEW, resumable), for the images role to load
    (`images_source: archive`). For a site with no registry; never a rebuild.

    Refused, before anything is saved, when OLD's tag for the profile is not the image OLD's verified
    gate served (its identity's image ID) or when OLD's disk cannot hold the archive beside what
    it serves. The archive on OLD is removed once NEW's deploy passed (`drop_old_archive`)."""
    from specdeploy.images.build import ARCHIVE_FORMAT, image_tag

    tag = image_tag(profile)
    found = run(m, m.old, ["podman", "image", "inspect", "--format", "{{.Id}} {{.Size}}", tag],
                what=f"OLD's engine image {tag}", ok_codes=(0, 125))  # fmt: skip
    if found.exited != 0:
        raise StepError(
            f"{m.old.name} has no image {tag}: there is nothing to save for NEW; nothing was copied",
            hint="prepare without --image-from-old: NEW pulls the image by digest from the site registry",
        )
    image_id, size = found.stdout.split()
    old_report = json.loads((m.workdir / "old-verified-gate.json").read_text())
    served = ((old_report.get("golden") or {}).get("identity") or {}).get("image_id")
    if served and served.removeprefix("sha256:") != image_id:
        raise StepError(
            f"{m.old.name}: {tag} is image sha256:{image_id[:12]}, but OLD's verified gate served "
            f"{served.removeprefix('sha256:')[:12]}: saving the tag would give NEW another image than OLD serves; "
            "nothing was copied",
            hint="prepare without --image-from-old (the image by digest from the site registry), or re-deploy OLD "
            "so its gate covers what it serves, then plan again",
        )
    source = posixpath.join(m.layout(m.old).state.as_posix(), "migrate", f"engine-image-{image_id[:12]}.tar")
    if run(m, m.old, ["test", "-f", source], what="OLD's saved image", ok_codes=(0, 1)).exited != 0:
        free = int(run(m, m.old, ["python3", "-c", FREE_BYTES, source], what="OLD's free space").stdout)
        fills = "OLD's disk, under the engine serving there"
        if problem := space_problem(m.old.name, source, free=free, needed=int(size), what="image", fills=fills):
            raise StepError(problem + "; nothing was saved", hint="prepare without --image-from-old (the registry)")
        run(m, m.old, ["mkdir", "-p", "--", posixpath.dirname(source)], what="OLD's directory for the image")
        m.progress(f"saving {tag} on {m.old.name} ({human(int(size))})")
        run(m, m.old, ["podman", "image", "save", "--format", ARCHIVE_FORMAT, "--output", f"{source}.part", tag],
            what=f"saving {tag}")  # fmt: skip
        run(m, m.old, ["mv", "--", f"{source}.part", source], what="OLD's saved image into place")
    sha = run(m, m.old, ["sha256sum", "--", source], what="the saved image's sha256").stdout.split()[0]
    item = seed.SeedFile("image", image_id[:12], m.layout(m.new).image_archive.as_posix(), sha, source=source)
    copied = _seed(m, m.old, m.new, [item], f"seeding the image archive from {m.old.name} to {m.new.name}")
    return {"tag": tag, "image_id": f"sha256:{image_id}", "saved_on_old": source, "sha256": sha} | copied.to_json()


def _seed(m: Migration, origin: HostAccess, to: HostAccess, items: list[seed.SeedFile], what: str) -> seed.SeedResult:
    """seed.seed between two hosts, saying every 20 s how many bytes have crossed (GBs take minutes)."""
    m.progress(what)
    moved = [0]
    with progress.step(what) as step:

        def copied(n: int) -> None:
            moved[0] += n
            step.observe(f"{human(moved[0])} copied")

        return seed.seed(
            seed.FabricSide(m.conn(origin), origin.name), seed.FabricSide(m.conn(to), to.name), items, progress=copied
        )


def drop_old_archive(m: Migration, image: dict[str, Any]) -> None:
    """OLD's saved image is GBs on the disk of a serving host: gone once NEW loaded it and passed."""
    run(m, m.old, ["rm", "-f", "--", image["saved_on_old"]], what="removing OLD's saved image")


def prepare(
    m: Migration, rec: record.MigrationRecord, seed_from: HostAccess | None = None, *, image_from_old: bool = False
) -> dict[str, Any]:
    """`seed_from`: a site mirror (an inventory host holding the models directory at OLD's path) to copy
    the weights from instead of OLD; each file is verified against the lock all the same.
    `image_from_old`: NEW gets OLD's image as an archive saved on OLD (`image_of_old`), not from the
    site registry: it overrides the site's and the inventory's `images_source` for this deploy."""
    source = image_source(m.deploy_args, m.new.variables.get("images_source"))  # a rebuild is refused even so
    origin = seed_from or m.old
    planned = rec.steps["plan"].details
    profile_path = m.workdir / "profiles" / f"{planned['profile']}.yaml"
    profile = load_profile(profile_path)
    items = seed.planned_files(profile, Lock(m.lock_path), planned["models_old"], planned["revisions"])
    if planned["models_old"] != planned["models_new"]:
        raise StepError(
            f"OLD keeps models in {planned['models_old']}, NEW in {planned['models_new']}: seeding copies to the "
            "same path",
            hint="give NEW the same specdeploy_models_dir as OLD in the inventory, then plan again",
        )
    if origin is not m.old and m.layout(origin).models.as_posix() != planned["models_old"]:
        raise StepError(
            f"--seed-from {origin.name} keeps models in {m.layout(origin).models.as_posix()}, OLD in "
            f"{planned['models_old']}: the lock's files are copied from the same paths",
            hint=f"give {origin.name} the same specdeploy_models_dir as OLD in the inventory, or seed from OLD",
        )
    seeded = _seed(m, origin, m.new, items, f"seeding {len(items)} files from {origin.name} to {m.new.name}")
    old_layout, new_layout = m.layout(m.old), m.layout(m.new)
    key = planned["identity_key"]
    golden_text = run(m, m.old, ["cat", "--", f"{old_layout.golden.as_posix()}/{key}.json"], what="OLD's golden")
    run(m, m.new, ["mkdir", "-p", "--", new_layout.golden.as_posix()], what="NEW's golden directory")
    with m.conn(m.new).sftp().open(f"{new_layout.golden.as_posix()}/{key}.json", "w") as f:
        f.write(golden_text.stdout)
    image = image_of_old(m, profile) if image_from_old else None
    run_id = keeper.new_run_id()
    extra = {"weights_source": "present", "images_source": source, "front_rotate": "false", "specdeploy_run_id": run_id}
    if image is not None:  # the archive is on NEW already: the role loads it, copying nothing from the controller
        extra |= {"images_source": "archive", "images_archive_src": ""}
    code = _deploy(m, m.new, profile, profile_path.parent, extra)
    report = read_json_file(m, m.new, new_layout.gate_report(run_id).as_posix(), what="NEW's gate report")
    if code != 0:
        gate = (
            f"its gate: {report.get('verdict')}: {report.get('message')}"
            if report
            else "the play stopped before the gate"
        )
        raise StepError(
            f"deploy.yml on {m.new.name} exited {code} ({gate}): NEW is not prepared (it takes no traffic)",
            hint=f"read the play's log in {m.workdir}, fix what it names, and run `migrate prepare` again "
            "(verified files are not copied again)",
        )
    if image is not None:
        drop_old_archive(m, image)
    return {
        "seed": seeded.to_json() | {"from": origin.name}, "golden": key, "deploy": "passed", "gate_run": run_id,
        "images_source": f"archive from OLD (instead of {source})" if image is not None else source, "image": image,
    }  # fmt: skip


def verify(m: Migration, rec: record.MigrationRecord) -> dict[str, Any]:
    planned = rec.steps["plan"].details
    profile = load_profile(m.workdir / "profiles" / f"{planned['profile']}.yaml")
    new_layout = m.layout(m.new)
    run_id = keeper.new_run_id()
    installed = posixpath.join(layout.InstallLayout().to_json()["profiles"], f"{profile.name}.yaml")
    m.progress(f"gating {m.new.name}")
    run(
        m,
        m.new,
        [CLI, "gate", "--profile", installed, "--run-id", run_id, "--no-rollback", "--json"],
        what="NEW's gate",
        ok_codes=(0, 1, 2, 3),
    )
    report = read_json_file(m, m.new, new_layout.gate_report(run_id).as_posix(), what="NEW's gate report")
    if report is None:
        raise StepError(f"{m.new.name}: its gate wrote no report", hint="run `specdeploy gate` on NEW by hand")
    atomic.write_json(m.workdir / "new-gate.json", report)
    old_report = json.loads((m.workdir / "old-verified-gate.json").read_text())
    result = compare.compare(old_report, report, decode_rate_tolerance=profile.migration.decode_rate_tolerance)
    details = {"new_report": run_id, "comparison": result.to_json(), "summary": result.summary()}
    if not result.same:
        raise StepError(
            f"{m.new.name} does not serve what {m.old.name} serves: {result.summary()}; traffic stays on OLD",
            hint="fix NEW (re-run `migrate prepare`), then `migrate verify` again; `migrate rollback` abandons it",
        )
    return details


def front_failures(m: Migration) -> int | None:
    """The fronts' own count of failed requests so far (5xx answers, connection and response errors),
    every front host's together; None through a hook (the site's balancer keeps its own count)."""
    return _failures([front_command(m, "status", "", front=front) for front in m.fronts])


def _failures(shown: list[dict[str, Any]]) -> int | None:
    counts = [front.get("failures") for front in shown]
    if not counts or any(failures is None for failures in counts):
        return None
    return sum(int(v) for failures in counts if failures is not None for v in failures.values())


def _difference(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def move(m: Migration, rec: record.MigrationRecord, *, to: HostAccess, away: HostAccess) -> dict[str, Any]:
    """Traffic from `away` to `to` through the front: `to` in (once its health check passes), `away`
    drained (its in-flight requests finish), `away` out. Times each step, and counts the requests
    the front saw fail meanwhile (its own counters, before and after)."""
    profile = load_profile(m.workdir / "profiles" / f"{rec.profile}.yaml")
    fronts = m.fronts
    # one look at each front: its failures so far, its servers
    before = [front_command(m, "status", "", front=front) for front in fronts]
    failed_before = _failures(before)
    started = time.monotonic()
    steps = []
    rec.traffic_on = "both"
    plan: list[tuple[str, str, list[str]]] = [
        ("enable", to.name, ["--wait"]),
        ("drain", away.name, ["--wait", "--timeout", str(profile.migration.drain_timeout_s)]),
        ("disable", away.name, []),
    ]
    twin = backup_name(m.old.name)
    # HAProxy: OLD's backup twin serves while NEW is down, until `migrate finish` (a front rendered before
    # the twins existed has none: the move goes on without it, and says so)
    has_twin = m.front_hook is None and all(
        twin in {server["name"] for server in shown.get("servers", [])} for shown in before
    )
    if has_twin:
        plan.append(("enable", twin, ["--wait"]) if away is m.old else ("disable", twin, []))
    for verb, server, extra in plan:
        if verb == "drain" and len(fronts) > 1:
            # every front stops sending new requests to it first; then each waits for its own in flight
            for front in fronts:
                front_command(m, verb, server, "--no-wait", front=front)
        for front in fronts:
            at, t = time.time(), time.monotonic()
            shown = front_command(m, verb, server, *extra, front=front)
            steps.append(
                {
                    "step": verb,
                    "server": server,
                    "front": front.name,
                    "at_unix": round(at, 3),  # when the step began: a load's own timeline can be set against it
                    "elapsed_s": round(time.monotonic() - t, 2),
                    "in_flight_before": shown.get("in_flight_before"),
                    "sessions_before": shown.get("sessions_before"),  # each server's, just before the change
                }
            )
    rec.traffic_on = "new" if to is m.new else "old"
    return {
        "duration_s": round(time.monotonic() - started, 2),
        "steps": steps,
        "old_as_backup": (
            ("in" if away is m.old else "out")
            if has_twin
            else "none: the front renders no backup server (deploy the front again: deploy.yml -l specdeploy_front)"
        ),
        "failed_requests_at_front": _difference(front_failures(m), failed_before),
        "finished_unix": time.time(),
    }


def cutover(m: Migration, rec: record.MigrationRecord) -> dict[str, Any]:
    return move(m, rec, to=m.new, away=m.old)


def rollback(m: Migration, rec: record.MigrationRecord) -> dict[str, Any]:
    """Back to OLD from any step: before cutover nothing reached NEW (NEW is only left out)."""
    if m.front is None or not _new_in_front(m):
        rec.traffic_on = "old"
        return {"traffic": "on OLD only: nothing to move", "steps": []}
    return move(m, rec, to=m.old, away=m.new)


def _new_in_front(m: Migration) -> bool:
    return any(front_servers(m, front).get(m.new.name, {}).get("state") in ("ready", "drain") for front in m.fronts)


def finish(m: Migration, rec: record.MigrationRecord, *, stop_old: bool) -> dict[str, Any]:
    if not stop_old:
        raise StepError(
            "`migrate finish` takes OLD out of service (its engine stopped, its unit, key and images removed): "
            "it needs --stop-old, said explicitly",
            hint="pass --stop-old once NEW has served long enough (the profile's migration.soak_s)",
        )
    profile = load_profile(m.workdir / "profiles" / f"{rec.profile}.yaml")
    cut = rec.steps["cutover"].details.get("finished_unix", 0)
    served = time.time() - cut
    if rec.traffic_on != "new" or served < profile.migration.soak_s:
        raise StepError(
            f"NEW has served alone for {served:.0f} s of the profile's soak of {profile.migration.soak_s} s "
            f"(traffic on: {rec.traffic_on}): OLD is still the way back",
            hint=f"wait {max(0, profile.migration.soak_s - served):.0f} s more, then `migrate finish --stop-old`",
        )
    light = run(m, m.new, [CLI, "watch", "run", "--json"], what="NEW's light gate", ok_codes=(0, 1, 2))
    result = json.loads(light.stdout) if light.stdout.strip() else {}
    if light.exited != 0:
        raise StepError(
            f"{m.new.name}: its light gate did not pass ({result.get('verdict')}: {result.get('message')}): OLD is "
            "kept",
            hint="`migrate rollback` moves traffic back to OLD; fix NEW, then finish again",
        )
    # OLD's backup twin out first (the way back ends here), then decommission.yml drains OLD from the front
    # and takes it out (a fleet deploy since cutover may have put it back in): an engine the front still
    # sends to is never stopped
    for front in m.fronts if m.front_hook is None else []:
        if backup_name(m.old.name) in front_servers(m, front):
            front_command(m, "disable", backup_name(m.old.name), front=front)
    playbook_dir = m.playbook_dir or Path(__file__).resolve().parents[3] / "ansible"
    playbook = str(ansible_program("ansible-playbook", why=f"{m.old.name} cannot be decommissioned"))
    argv = [playbook, "decommission.yml", "-i", str(m.inventory), "-l", m.old.name]
    argv += ["-e", f"specdeploy_profile={profile.name}", "-e", f"specdeploy_profiles_src={m.workdir / 'profiles'}"]
    if m.vault_password_file is not None:
        argv += ["--vault-password-file", str(m.vault_password_file)]
    log = m.workdir / f"decommission-{m.old.name}.log"
    code = _play(m, argv, playbook_dir, log, f"decommission.yml -l {m.old.name}")
    if code != 0:
        raise StepError(
            f"decommission.yml on {m.old.name} exited {code}: OLD's engine may still run",
            hint=f"read {log}; traffic is on NEW either way",
        )
    return {
        "light_gate": result.get("verdict"),
        "old_engine": "stopped and removed (decommission.yml: unit, key and images; weights and state kept)",
        "keep_old_until_days": profile.migration.keep_old_days,
    }
