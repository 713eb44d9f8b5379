"""Bad input to `image build|ensure|check`, `unit render|install`, `engine venv|api-key` and
`startup-log` (issue 20: D14, D15, D17); `rehearsal ...` is in test_rehearsal.py.

Each case runs the real CLI the way a user (or the images and engine roles) does and checks what
docs/commands.md's bad-input table promises: the exit code, the option or file named, the fix, no
traceback — and, where nothing may change, the lock, the unit directory, the state and rollback
directories byte-identical to before. podman is never the real one: `--podman` names a stand-in
script in tmp_path that records its arguments (so a case can assert that nothing was run) and
prints what the case needs. A FIFO runs as a subprocess with a deadline: it must be refused,
never read.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.badinput import CONTAINER, PODMAN_FIX, Podman, Run, Snapshot, write

from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import variants

DIGEST = "sha256:" + "1" * 64
LOG_FIX = "journalctl"
KEY_FIX = "openssl rand"
ARCHIVE_FIX = "wheelhouse.sh"


# --------------------------------------------------------------------------- stand-ins


@pytest.fixture
def podman(tmp_path: Path) -> Podman:
    return Podman(tmp_path / "podman-stub")


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def not_executable(path: Path) -> Path:
    write(path, "#!/bin/sh\nexit 0\n").chmod(0o644)
    return path


def materialize(profile: Profile, tmp_path: Path) -> Path:
    return variants.materialize(profile, tmp_path / "profiles")


def patched(base: str, name: str, patch: dict[str, Any], tmp_path: Path) -> Path:
    return materialize(variants.derive(load_profile(base), name, patch), tmp_path)


def keyed_venv_profile(tmp_path: Path) -> Path:
    """cpu-rehearsal serving with an API key (venv runtime: no podman involved)."""
    return patched(
        "cpu-rehearsal", "cpu-rehearsal-keyed", {"engine": {"serve": {"api_key": {"secret": "k1"}}}}, tmp_path
    )


def context_dir(tmp_path: Path) -> Path:
    """A build context holding the container profile's Containerfile (never built: podman is a stub)."""
    containerfile = load_profile(CONTAINER).engine.image.containerfile  # type: ignore[union-attr]
    write(tmp_path / "context" / containerfile, "FROM scratch\n")
    return tmp_path / "context"


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    """An empty directory for the lock: a refused command must not create the lock in it."""
    path = tmp_path / "lockdir"
    path.mkdir()
    return path


# =========================================================================== image build


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        ("missing", ["--podman", "no such file"]),
        ("not-executable", ["--podman", "not executable"]),
        ("empty", ["--podman is empty"]),
    ],
    ids=["missing", "not-executable", "empty"],
)
def test_image_build_refuses_a_podman_that_cannot_run_before_anything_is_built(
    run: Run, snapshot: type[Snapshot], tmp_path: Path, lock_dir: Path, kind: str, names: list[str]
) -> None:
    podman = {
        "missing": str(tmp_path / "nope" / "podman"),
        "not-executable": str(not_executable(tmp_path / "podman")),
        "empty": "",
    }[kind]
    before = snapshot(lock_dir)
    run("image", "build", "--profile", CONTAINER, "--context", context_dir(tmp_path), "--podman", podman,
        "--lock", lock_dir / "specdeploy.lock").expect(2, *names, fix=PODMAN_FIX)  # fmt: skip
    before.unchanged()


@pytest.mark.parametrize("what", ["missing", "without-containerfile"], ids=["missing-dir", "no-containerfile"])
def test_image_build_refuses_a_context_that_does_not_hold_the_containerfile(
    run: Run, tmp_path: Path, what: str
) -> None:
    context = tmp_path / "context"
    if what == "without-containerfile":
        context.mkdir()
    found = "found nothing there"
    run("image", "build", "--profile", CONTAINER, "--context", context, "--dry-run").expect(
        2, "--context", str(context), found, fix="as --context"
    )


def test_image_build_refuses_a_driver_version_that_is_not_one(run: Run, tmp_path: Path) -> None:
    run("image", "build", "--profile", "a6000-dflash", "--driver", "abc", "--dry-run").expect(
        2, "--driver", "'abc'", "550.127.05", fix="nvidia-smi --query-gpu=driver_version"
    )


def test_image_build_refuses_a_venv_profile_which_has_no_image(run: Run, tmp_path: Path) -> None:
    run("image", "build", "--profile", "cpu-rehearsal", "--dry-run").expect(
        2, "cpu-rehearsal", "engine.runtime venv", fix="container profile"
    )


# =========================================================================== image ensure


def ensure(*extra: object, podman: object, lock: Path) -> list[object]:
    return ["image", "ensure", "--profile", CONTAINER, "--podman", podman, "--lock", lock / "specdeploy.lock", *extra]


def test_image_ensure_refuses_an_unknown_source_before_podman_runs(
    run: Run, podman: Podman, lock_dir: Path, snapshot: type[Snapshot]
) -> None:
    before = snapshot(lock_dir)
    run(*ensure("--source", "bogus", podman=podman, lock=lock_dir)).expect(
        2, "--source", "'bogus'", "build, pull, archive", fix="--source build"
    )
    assert podman.calls() == []
    before.unchanged()


@pytest.mark.parametrize("kind", ["directory", "fifo"], ids=["archive-is-a-directory", "archive-is-a-fifo"])
def test_image_ensure_refuses_an_archive_that_is_not_a_file_before_podman_loads_it(
    run: Run, podman: Podman, lock_dir: Path, tmp_path: Path, snapshot: type[Snapshot], kind: str
) -> None:
    archive = tmp_path / "image.tar"
    archive.mkdir() if kind == "directory" else fifo(archive)
    before = snapshot(lock_dir)
    found = "a directory" if kind == "directory" else "a FIFO"
    run(*ensure("--source", "archive", "--archive", archive, podman=podman, lock=lock_dir)).expect(
        2, "--archive", str(archive), found, fix="podman save -o FILE"
    )
    assert podman.calls() == []
    before.unchanged()


def test_image_ensure_refuses_a_missing_build_context_before_podman_runs(
    run: Run, podman: Podman, lock_dir: Path, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    before = snapshot(lock_dir)
    run(*ensure("--source", "build", "--context", tmp_path / "nope", podman=podman, lock=lock_dir)).expect(
        2, "--context", "nope", "found nothing there", fix="as --context"
    )
    assert podman.calls() == []
    before.unchanged()


def test_image_ensure_refuses_a_base_archive_that_is_a_directory(
    run: Run, podman: Podman, lock_dir: Path, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    base = tmp_path / "base.tar"
    base.mkdir()
    before = snapshot(lock_dir)
    argv = ensure("--source", "build", "--context", context_dir(tmp_path), "--base-archive", base, podman=podman,
                  lock=lock_dir)  # fmt: skip
    run(*argv).expect(2, "--base-archive", str(base), "a directory", fix="podman save -o FILE")
    assert podman.calls() == []
    before.unchanged()


def test_image_ensure_refuses_a_podman_that_does_not_exist(
    run: Run, lock_dir: Path, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    before = snapshot(lock_dir)
    run(*ensure("--source", "pull", podman=tmp_path / "nope", lock=lock_dir)).expect(
        2, "--podman", "no such file", fix=PODMAN_FIX
    )
    before.unchanged()


# =========================================================================== image check


@pytest.mark.parametrize("kind", ["missing", "not-executable"], ids=["missing", "not-executable"])
def test_image_check_refuses_a_podman_that_cannot_run(run: Run, tmp_path: Path, kind: str) -> None:
    podman = tmp_path / "nope" if kind == "missing" else not_executable(tmp_path / "podman")
    found = "no such file" if kind == "missing" else "not executable"
    run("image", "check", "some/image", "--profile", CONTAINER, "--podman", podman).expect(
        2, "--podman", str(podman), found, fix=PODMAN_FIX
    )


@pytest.mark.parametrize("printed", ["garbage", "[1, 2]"], ids=["not-json", "a-list"])
def test_image_check_refuses_a_podman_whose_labels_are_not_a_json_object(
    run: Run, tmp_path: Path, printed: str
) -> None:
    podman = Podman(tmp_path / "stub", printed)
    run("image", "check", "some/image", "--profile", CONTAINER, "--podman", podman).expect(
        2, "--podman", "expected a JSON object of labels", printed, fix=PODMAN_FIX
    )


def test_image_check_with_labels_of_other_types_fails_the_check_without_a_traceback(run: Run, tmp_path: Path) -> None:
    labels = '{"org.opencontainers.image.base.digest": 5, "org.opencontainers.image.version": 1}'
    podman = Podman(tmp_path / "stub", by_verb={"image inspect": labels, "run": "[1]"})
    answer = run("image", "check", "some/image", "--profile", CONTAINER, "--podman", podman).expect(
        1, "org.opencontainers.image.version", "inside", fix=f"build --profile {CONTAINER}`"
    )
    rows = {
        cells[2]: cells[1:]
        for line in answer.stdout.splitlines()
        if len(cells := [c.strip() for c in line.split("│")]) > 4
    }
    # the found values as the labels hold them (an integer label is no version): each row failed
    assert rows["org.opencontainers.image.version"][0] == "FAIL" and rows["org.opencontainers.image.version"][3] == "1"
    assert rows["org.opencontainers.image.base.digest"][0] == "FAIL"
    assert rows["org.opencontainers.image.base.digest"][3] == "5"
    inside = rows["inside: build_guards.py inspect"]
    assert inside[0] == "FAIL" and "the guard's inspect printed JSON list" in inside[3], inside


def test_image_check_refuses_a_venv_profile_which_has_no_image(run: Run, podman: Podman) -> None:
    run("image", "check", "some/image", "--profile", "cpu-rehearsal", "--podman", podman).expect(
        2, "cpu-rehearsal", "engine.runtime venv", fix="container profile"
    )
    assert podman.calls() == []


# =========================================================================== unit render


@pytest.mark.parametrize(
    ("image", "found"),
    [
        ("localhost/specdeploy-rehearsal/vllm-cpu:latest", "a mutable tag"),
        ("localhost/specdeploy-rehearsal/vllm-cpu", "a name without a digest"),
        ("localhost/specdeploy-rehearsal/vllm-cpu@sha256:abc", "not 64 lowercase hex digits"),
    ],
    ids=["tag", "bare-name", "short-digest"],
)
def test_unit_render_refuses_an_image_that_is_not_pinned_by_digest(run: Run, image: str, found: str) -> None:
    run("unit", "render", "--profile", CONTAINER, "--image", image).expect(
        2, "--image", image, "NAME@sha256:", found, fix="image ensure"
    )


def test_unit_render_without_image_for_a_container_profile_is_a_usage_error(run: Run) -> None:
    run("unit", "render", "--profile", CONTAINER).expect(2, "--image is missing", "NAME@sha256:", fix="image ensure")


def test_unit_render_refuses_an_image_for_a_venv_profile(run: Run) -> None:
    run("unit", "render", "--profile", "cpu-rehearsal", "--image", f"x/y@{DIGEST}").expect(
        2, "--image", "runs its engine from a venv", fix="leave --image out"
    )


def test_the_listener_refuses_an_address_that_is_not_the_host_s_internal_one(run: Run) -> None:
    """Issue 35: the listener takes the internal address; a name, a wildcard (it would also take the
    engine's loopback port) and loopback (out of the front's reach) are refused, naming the value."""
    run("front", "listener", CONTAINER, "--address", "my host").expect(
        2, "--address", "'my host'", "IP address", fix="specdeploy_publish_host"
    )
    run("front", "listener", CONTAINER, "--address", "0.0.0.0").expect(
        2, "--address", "'0.0.0.0'", "a wildcard", fix="specdeploy_publish_host"
    )
    run("front", "listener", CONTAINER, "--address", "127.0.0.1").expect(
        2, "--address", "'127.0.0.1'", "a loopback address", fix="specdeploy_publish_host"
    )


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"engine": {"serve": {"extra_args": ["--x\nExecStartPre=/bin/sh -c id"]}}}, "engine.serve.extra_args[0]"),
        ({"engine": {"env": {"HF_HUB_OFFLINE": "1\nExecStartPre=/bin/sh -c id"}}}, "engine.env.HF_HUB_OFFLINE"),
    ],
    ids=["extra-arg", "env-value"],
)
def test_unit_render_refuses_a_line_break_that_would_inject_a_directive(
    run: Run, tmp_path: Path, patch: dict[str, Any], field: str
) -> None:
    profile = patched("cpu-rehearsal", "cpu-rehearsal-nl", patch, tmp_path)
    answer = run("unit", "render", "--profile", profile).expect(2, field, "control characters", fix="remove the line")
    assert "ExecStartPre" not in answer.stdout


# =========================================================================== unit install


def install(dest: Path, *extra: object, profile: object = "cpu-rehearsal") -> list[object]:
    return ["unit", "install", dest, "--profile", profile, *extra]


def test_unit_install_refuses_a_dest_that_is_a_file(run: Run, tmp_path: Path, snapshot: type[Snapshot]) -> None:
    dest = write(tmp_path / "units", "not a directory\n")
    before = snapshot(tmp_path)
    run(*install(dest, "--state-dir", tmp_path / "state")).expect(
        2, "unit directory", str(dest), "a regular file", fix="specdeploy facts"
    )
    before.unchanged()


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo"])
def test_unit_install_with_a_state_dir_reads_the_profile_as_every_profile_is_read(
    run_process: Run, tmp_path: Path, snapshot: type[Snapshot], kind: str
) -> None:
    """The profile copy kept under --state-dir read the profile file raw, before the bounded load:
    a missing path or a directory was exit 70, a FIFO blocked the play forever."""
    profile = tmp_path / "profiles" / "cpu-rehearsal.yaml"
    profile.parent.mkdir()
    if kind == "directory":
        profile.mkdir()
    elif kind == "fifo":
        os.mkfifo(profile)
    (tmp_path / "units").mkdir()
    before = snapshot(tmp_path)
    found, fix = {
        "missing": ("does not exist", "pass the path of an existing profile"),
        "directory": ("a directory", "pass the path of the profile file itself"),
        "fifo": ("a FIFO", "pass the path of the profile file itself"),
    }[kind]
    run_process(*install(tmp_path / "units", "--state-dir", tmp_path / "state", profile=profile)).expect(
        2, "profile", str(profile), found, fix=fix
    )
    before.unchanged()


def test_unit_install_refuses_a_dest_whose_parent_is_missing(
    run: Run, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    dest = tmp_path / "no" / "such" / "units"
    before = snapshot(tmp_path)
    run(*install(dest)).expect(2, "unit directory", str(dest), "found nothing there", fix="specdeploy facts")
    before.unchanged()
    assert not (tmp_path / "no").exists()


def test_unit_install_refuses_a_unit_path_that_is_a_directory_and_keeps_no_copy(
    run: Run, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    dest = tmp_path / "units"
    write(dest / "specdeploy-engine.service" / "inside", "x")
    rollback = tmp_path / "rollback"
    rollback.mkdir()
    before = snapshot(dest, rollback)
    run(*install(dest, "--rollback-dir", rollback, "--run-id", "r1")).expect(
        2, str(dest / "specdeploy-engine.service"), "a directory", fix="remove"
    )
    before.unchanged()


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Path:
    """A directory nothing can be written to: sysfs when root (root ignores modes), else mode 0555."""
    if os.geteuid() == 0:
        if not os.path.ismount("/sys"):
            pytest.skip("root without a sysfs mount: no directory root cannot write")
        return Path("/sys")
    path = tmp_path / "ro"
    path.mkdir()
    path.chmod(0o555)
    return path


def test_unit_install_into_a_read_only_dir_writes_nothing_anywhere(
    run: Run, tmp_path: Path, read_only_dir: Path, snapshot: type[Snapshot]
) -> None:
    state, rollback = tmp_path / "state", tmp_path / "rollback"
    state.mkdir()
    rollback.mkdir()
    before = snapshot(state, rollback)
    answer = run(*install(read_only_dir, "--state-dir", state, "--rollback-dir", rollback, "--run-id", "r1"))
    before.unchanged()  # first: no profile copy, no rollback staging left behind
    answer.expect(1, str(read_only_dir), "cannot be written", "nothing was written", fix="run as root")


def test_unit_install_refuses_a_mutable_tag_before_the_profile_copy_is_kept(
    run: Run, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    dest, state = tmp_path / "units", tmp_path / "state"
    dest.mkdir()
    state.mkdir()
    before = snapshot(dest, state)
    run(*install(dest, "--state-dir", state, "--image", "localhost/x:latest", profile=CONTAINER)).expect(
        2, "--image", "a mutable tag", fix="image ensure"
    )
    before.unchanged()


def test_unit_install_refuses_a_rollback_dir_without_a_run_id_before_writing(
    run: Run, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    dest, state = tmp_path / "units", tmp_path / "state"
    dest.mkdir()
    state.mkdir()
    before = snapshot(dest, state)
    run(*install(dest, "--state-dir", state, "--rollback-dir", tmp_path / "rollback")).expect(
        2, "--rollback-dir needs --run-id", fix="pass --run-id"
    )
    before.unchanged()
    assert not (tmp_path / "rollback").exists()


def test_unit_install_replaces_an_existing_unit_that_is_not_utf8(run: Run, tmp_path: Path) -> None:
    dest = tmp_path / "units"
    write(dest / "specdeploy-engine.service", b"\xff\xfe not a unit \x00")
    run(*install(dest)).expect(0, '"changed": true')
    assert (dest / "specdeploy-engine.service").read_text().startswith("# Managed by specdeploy")


# =========================================================================== engine venv


def tar_of(path: Path, members: dict[str, bytes], *, link: str | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return path


def venv_cmd(archive: Path, root: Path, name: str = "tinyengine-1.0") -> list[object]:
    return ["engine", "venv", "--archive", archive, "--root", root, "--name", name]


@pytest.mark.parametrize(
    ("kind", "found"),
    [("missing", "found nothing there"), ("directory", "a directory"), ("fifo", "a FIFO")],
    ids=["missing", "directory", "fifo"],
)
def test_engine_venv_refuses_an_archive_that_is_not_a_file(run: Run, tmp_path: Path, kind: str, found: str) -> None:
    archive = tmp_path / "engine.tar"
    if kind == "directory":
        archive.mkdir()
    elif kind == "fifo":
        fifo(archive)
    root = tmp_path / "engines"
    run(*venv_cmd(archive, root)).expect(2, "--archive", str(archive), found, fix=ARCHIVE_FIX)
    assert not root.exists()


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda p: write(p, "not a tar at all\n"), ["cannot be unpacked"]),
        (lambda p: tar_of(p, {"tinyengine-1.0-py3-none-any.whl": b"x"}), ["has no requirements.lock"]),
        (lambda p: tar_of(p, {"requirements.lock": b""}, link="evil"), ["refusing member 'evil'"]),
    ],
    ids=["not-a-tar", "no-requirements-lock", "symlink-member"],
)
def test_engine_venv_refuses_a_bad_archive_before_anything_under_root_is_created(
    run: Run, tmp_path: Path, make: Callable[[Path], Path], names: list[str]
) -> None:
    archive = make(tmp_path / "engine.tar")
    root = tmp_path / "engines"
    run(*venv_cmd(archive, root)).expect(2, str(archive), *names, fix="wheelhouse.sh")
    assert not root.exists()


def test_engine_venv_refuses_a_name_that_leaves_the_root(run: Run, tmp_path: Path) -> None:
    archive = write(tmp_path / "engine.tar", "not a tar\n")  # never unpacked: the name is refused first
    root = tmp_path / "engines"
    run(*venv_cmd(archive, root, "../escape")).expect(2, "--name", "'../escape'", fix="engine.name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.tar"]


def test_engine_venv_refuses_a_root_that_is_a_file(run: Run, tmp_path: Path, snapshot: type[Snapshot]) -> None:
    archive = write(tmp_path / "engine.tar", "not a tar\n")
    root = write(tmp_path / "engines", "a file\n")
    before = snapshot(tmp_path)
    run(*venv_cmd(archive, root)).expect(2, "--root", str(root), "a regular file", fix="engine.root")
    before.unchanged()


# =========================================================================== engine api-key


@pytest.mark.parametrize(
    ("stdin", "names"),
    [
        ("", ["at least 16 characters, found 0"]),
        ("short\n", ["at least 16 characters, found 5"]),
        ("k" * 70_000, ["at most 65536 bytes"]),
    ],
    ids=["empty-stdin", "short", "70-kB-without-newline"],
)
def test_engine_api_key_refuses_a_missing_short_or_unbounded_key_and_writes_nothing(
    run: Run, tmp_path: Path, snapshot: type[Snapshot], stdin: str, names: list[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    before = snapshot(state)
    run("engine", "api-key", "--profile", keyed_venv_profile(tmp_path), "--state-dir", state, input=stdin).expect(
        2, "API key", *names, fix=KEY_FIX
    )
    before.unchanged()


def test_engine_api_key_refuses_a_key_file_path_that_is_a_directory(
    run: Run, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    state = tmp_path / "state"
    (state / "secrets" / "k1").mkdir(parents=True)
    before = snapshot(state)
    run("engine", "api-key", "--profile", keyed_venv_profile(tmp_path), "--state-dir", state,
        input="k" * 32 + "\n").expect(2, str(state / "secrets" / "k1"), "a directory", fix="remove")  # fmt: skip
    before.unchanged()


def test_engine_api_key_refuses_a_state_dir_that_is_a_file(run: Run, tmp_path: Path, snapshot: type[Snapshot]) -> None:
    state = write(tmp_path / "state", "a file\n")
    profile = keyed_venv_profile(tmp_path)
    before = snapshot(state)
    run("engine", "api-key", "--profile", profile, "--state-dir", state, input="k" * 32 + "\n").expect(
        2, "--state-dir", str(state), "a regular file", fix="paths.state"
    )
    before.unchanged()


def test_engine_api_key_with_a_missing_podman_writes_no_key_file(
    run: Run, tmp_path: Path, snapshot: type[Snapshot]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    before = snapshot(state)
    run("engine", "api-key", "--profile", CONTAINER, "--state-dir", state, "--podman", tmp_path / "nope",
        input="k" * 32 + "\n").expect(2, "--podman", "no such file", fix=PODMAN_FIX)  # fmt: skip
    before.unchanged()


def test_engine_api_key_for_a_profile_without_a_key_is_refused_before_stdin_is_read(run: Run, tmp_path: Path) -> None:
    run("engine", "api-key", "--profile", "cpu-rehearsal", "--state-dir", tmp_path / "state", input="k" * 32).expect(
        2, "engine.serve.api_key", fix="api_key: {secret: specdeploy_api_key}"
    )
    assert not (tmp_path / "state").exists()


# =========================================================================== startup-log


@pytest.fixture
def dflash(tmp_path: Path) -> Path:
    """The rehearsal's DFlash profile (taps [0, 2]: vLLM logs (1, 3))."""
    return materialize(variants.dflash(), tmp_path)


@pytest.mark.parametrize(("kind", "found"), [("missing", "does not exist"), ("directory", "a directory")],
                         ids=["missing", "directory"])  # fmt: skip
def test_startup_log_refuses_a_file_that_is_not_a_log(
    run: Run, tmp_path: Path, dflash: Path, kind: str, found: str
) -> None:
    log = tmp_path / "engine.log"
    if kind == "directory":
        log.mkdir()
    run("startup-log", "--profile", dflash, "--file", log).expect(2, "engine log", str(log), found, fix=LOG_FIX)


def test_startup_log_refuses_a_fifo_at_once_instead_of_blocking(run_process: Run, tmp_path: Path, dflash: Path) -> None:
    log = fifo(tmp_path / "engine.log")
    run_process("startup-log", "--profile", dflash, "--file", log).expect(
        2, "engine log", str(log), "a FIFO", fix="pass a saved engine log"
    )


def test_startup_log_refuses_a_log_over_the_size_ceiling_without_reading_it(
    run: Run, tmp_path: Path, dflash: Path
) -> None:
    log = tmp_path / "engine.log"
    with log.open("wb") as fh:  # sparse: 65 MiB on paper, nothing on disk
        fh.truncate(65 * 1024 * 1024)
    run("startup-log", "--profile", dflash, "--file", log).expect(
        2, "engine log", "65.0 MiB", "64.0 MiB", fix="check that this is the right file"
    )


@pytest.mark.parametrize(
    ("line", "names", "fix"),
    [
        (
            "Using auxiliary layers from speculative config: (1)",
            ["vLLM logged (1,)", "expected auxiliary layers"],
            "serve the drafter config that `specdeploy verify-config` passes",
        ),
        (
            "Using auxiliary layers from speculative config: (,)",
            ["no auxiliary-layer line"],
            "run `specdeploy verify-config` on the serving directory",
        ),
        (
            "Using Eagle3 auxiliary layers from config: (1 3)",
            ["no auxiliary-layer line"],
            "run `specdeploy verify-config` on the serving directory",
        ),
    ],
    ids=["one-tuple-without-comma", "only-a-comma", "no-comma"],
)
def test_startup_log_reads_a_malformed_layer_tuple_as_a_failed_check_not_a_crash(
    run: Run, tmp_path: Path, dflash: Path, line: str, names: list[str], fix: str
) -> None:
    log = write(tmp_path / "engine.log", f"INFO 12-01 10:00:00 [gpu_model_runner.py:1] {line}\n")
    run("startup-log", "--profile", dflash, "--file", log).expect(1, *names, fix=fix)


def test_startup_log_refuses_a_profile_whose_target_layer_ids_are_unresolved(run: Run, tmp_path: Path) -> None:
    base = variants.dflash()
    drafter = base.model_dump(mode="json")["drafter"]
    drafter["config"]["expected"]["target_layer_ids"] = {"provenance": "unresolved", "source": "read at fetch"}
    profile = variants.derive(base, base.name, {"drafter": drafter}, replace=("drafter",))
    log = write(tmp_path / "engine.log", "Using auxiliary layers from speculative config: (1, 3)\n")
    run("startup-log", "--profile", materialize(profile, tmp_path), "--file", log).expect(
        2, "target_layer_ids", "unresolved", fix="resolve target_layer_ids"
    )


def test_startup_log_unit_on_a_machine_without_systemd_says_so(run: Run, tmp_path: Path, dflash: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    run("startup-log", "--profile", dflash, "--unit", "specdeploy-engine", "--timeout", "1",
        env={"PATH": str(empty)}).expect(2, "systemctl", "journal", fix="--file")  # fmt: skip


def test_startup_log_refuses_a_negative_timeout(run: Run, dflash: Path) -> None:
    run("startup-log", "--profile", dflash, "--unit", "specdeploy-engine", "--timeout", "-1").expect(
        2, "--timeout", "-1", fix="--timeout SECONDS"
    )


# =========================================================================== what must still pass


def test_unit_install_check_accepts_the_placeholder_image_ensure_check_prints(run: Run, tmp_path: Path) -> None:
    """`ansible-playbook --check`: `image ensure --check` names an image it would still build; the
    unit install in the same check run reports a change and writes nothing."""
    dest = tmp_path / "units"
    dest.mkdir()
    image = "localhost/specdeploy-rehearsal/vllm-cpu@(not yet build)"
    run(*install(dest, "--image", image, "--check", profile=CONTAINER)).expect(0, '"changed": true')
    assert list(dest.iterdir()) == []
    run(*install(dest, "--image", image, profile=CONTAINER)).expect(2, "--image", fix="image ensure")
