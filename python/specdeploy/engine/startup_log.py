"""Read an engine's startup log for proof that the drafter is wired as the profile intends.

vLLM shifts DFlash target_layer_ids by +1 (PR #40727) and logs the result, for
[1,16,31,46,61] the tuple (2, 17, 32, 47, 62). A build that applies the shift twice (reported
for #40898 + #40727 on top) or not at all reads the wrong hidden states and acceptance
collapses; this line is the only place the mistake is visible before traffic, so specdeploy
checks it instead of a person.

The two model runners word the line differently (docs/sources.md#vllm; both seen in real logs,
tests/data/gpu-vllm-0.26/):

| runner | line |
|---|---|
| V1 (`gpu_model_runner.py`) | `Using auxiliary layers from speculative config: (2, 17, 32, 47, 62)` |
| V2 (`eagle3_utils.py`) | `Using Eagle3 auxiliary layers from config: (1, 3)` |
| V2, no layers in the drafter config | `Using Eagle3 auxiliary layers from model: (...)` |

A check that knew one wording reported "no auxiliary-layer line" for every DFlash deploy on
stock vLLM, after polling for the whole readiness timeout (30 minutes on the GPU profiles).
The wait therefore ends as soon as the engine is ready or failed, and says what it found.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdeploy.core import files
from specdeploy.core.errors import ProfileError, ProgramError, SpecdeployError
from specdeploy.engine.speculation import ServedSpeculation
from specdeploy.profile import Profile

# The tuple as Python prints it — `(2, 17, 32, 47, 62)`, `(1,)`, `()` — with layer ids of at most
# nine digits: anything else in the parentheses is not a line vLLM printed (a hand-edited log,
# `(1 2)`, `(,)`, a 5000-digit number), and is not read as one.
_AUX_RE = re.compile(
    r"Using (?:Eagle3 )?auxiliary layers from (?P<origin>speculative config|config|model): "
    r"(?P<layers>\(\s*(?:[0-9]{1,9}\s*,\s*)*(?:[0-9]{1,9}\s*)?\))"
)
_LAYER_RE = re.compile(r"[0-9]+")
LOG_HINT = "pass a saved engine log, e.g. `journalctl -u specdeploy-engine --output=cat > engine.log`"


def read_log_file(path: Path | str) -> str:
    """A saved engine log: a regular file of at most LIMITS["text"] (a FIFO or a device is
    refused at once, never read), decoded leniently (a log may hold any bytes). An
    InputFileError (exit 2) naming the file otherwise."""
    data = files.read_bytes(path, what="engine log", limit=files.LIMITS["text"], hint=LOG_HINT)
    return data.decode("utf-8", errors="replace")


# what the runner that printed a line is called, by its wording
RUNNER_OF_ORIGIN = {"speculative config": "V1", "config": "V2", "model": "V2"}
_SPEC_RE = re.compile(r"speculative_config=SpeculativeConfig\(method='(?P<method>[^']*)'")
_RUNNER_RE = re.compile(r"Using (?P<runner>V[12]) Model Runner")
# vLLM's engine-config line: `speculative_config=SpeculativeConfig(method='dflash', model='...',
# num_spec_tokens=3)`, or `speculative_config=None` (recorded on vLLM 0.26, tests/data/gpu-vllm-0.26/)
_SPEC_SETUP_RE = re.compile(
    r"speculative_config=(?:None|SpeculativeConfig\(method='(?P<method>[^']*)'.*?num_spec_tokens=(?P<k>[0-9]{1,4})\))"
)


def served_speculation(log_text: str) -> ServedSpeculation | None:
    """The speculative setup the engine's last config line names, or None where the log has none."""
    matches = list(_SPEC_SETUP_RE.finditer(log_text))
    if not matches:
        return None
    last = matches[-1]
    if last.group("method") is None:
        return ServedSpeculation(None, 0, "the startup log: speculative_config=None")
    method, k = last.group("method"), int(last.group("k"))
    return ServedSpeculation(method, k, f"the startup log: SpeculativeConfig(method={method!r}, num_spec_tokens={k})")


# vLLM 0.32: "Default vLLM sampling parameters have been overridden by the model's `generation_config.json`:
# `{'temperature': 0.7}`. If this is not intended, ..." (config/model.py, get_diff_sampling_param); older
# releases: "Default sampling parameters have been overridden by the model's Hugging Face generation
# config recommended from the model creator."
_SAMPLING_RE = re.compile(
    r"Default (?:vLLM )?sampling parameters have been overridden by (?P<by>.+?)(?::\s*`(?P<params>\{[^`]*\})`)?\."
    r"(?:\s|$)"
)


def served_sampling_overrides(log_text: str) -> str | None:
    """What the engine logged when a generation config replaced its default sampling parameters (who
    and, where it says, which values), or None where it logged nothing of the kind."""
    matches = list(_SAMPLING_RE.finditer(log_text))
    if not matches:
        return None
    last = matches[-1]
    return f"{last.group('by')}: {last.group('params')}" if last.group("params") else last.group("by")


@dataclass(frozen=True)
class AuxLine:
    """One auxiliary-layer line as vLLM printed it."""

    layers: tuple[int, ...]
    runner: str  # "V1" or "V2", from the wording
    origin: str  # "speculative config" (V1), "config" or "model" (V2)


@dataclass(frozen=True)
class AuxLayerCheck:
    expected: tuple[int, ...]
    found: tuple[int, ...] | None
    ok: bool
    message: str
    runner: str | None = None  # the runner whose wording the line had
    fix: str = ""  # what to do when the check fails


# What to do about each way the check fails (its `fix`)
NOT_DFLASH_FIX = (
    "run `specdeploy verify-config` on the serving directory (architectures, dflash_config) and check that the "
    "engine runs the profile's command line (`specdeploy unit render`), then restart the engine"
)
RUNNER_FIX = "reinstall the unit from the profile (`specdeploy unit install`) and restart the engine"
ENGINE_FIX = (
    "run the engine the profile pins (`specdeploy image build` for a container profile, the pinned engine version "
    "for a venv one): its build must carry the +1 fix (#40727) exactly once"
)
LAYERS_FIX = (
    "serve the drafter config that `specdeploy verify-config` passes (dflash_config.target_layer_ids equal to the "
    "profile's) and restart the engine"
)


def expected_aux_layers(profile: Profile) -> tuple[int, ...]:
    ids = profile.drafter_expected("target_layer_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        found = "nothing (unresolved)" if ids is None else repr(ids)
        raise ProfileError(
            f"profile {profile.name}: field drafter.config.expected.target_layer_ids: expected the resolved list "
            f"of target layers the drafter taps, found {found}: there is no auxiliary-layer line to check against",
            hint="resolve target_layer_ids in the profile (the drafter's config.json dflash_config.target_layer_ids)",
        )
    return tuple(i + 1 for i in ids)


def expected_runner(profile: Profile) -> str | None:
    """The model runner the profile asks for (VLLM_USE_V2_MODEL_RUNNER), None when it leaves it to vLLM."""
    value = profile.engine.env.get("VLLM_USE_V2_MODEL_RUNNER")
    return None if value is None else ("V2" if value.strip() == "1" else "V1")


def find_aux_line(log_text: str) -> AuxLine | None:
    """The last auxiliary-layer line vLLM logged (any wording), or None."""
    matches = list(_AUX_RE.finditer(log_text))
    if not matches:
        return None
    last = matches[-1]
    origin = last.group("origin")
    layers = tuple(int(n) for n in _LAYER_RE.findall(last.group("layers")))
    return AuxLine(layers, RUNNER_OF_ORIGIN[origin], origin)


def find_aux_layers(log_text: str) -> tuple[int, ...] | None:
    """The last auxiliary-layer tuple vLLM logged, or None."""
    line = find_aux_line(log_text)
    return line.layers if line else None


def describe_instead(log_text: str) -> str:
    """What the log shows in place of an auxiliary-layer line: the method and runner it names."""
    seen = []
    if methods := _SPEC_RE.findall(log_text):
        seen.append(f"the engine was configured with speculative method {methods[-1]!r}")
    elif "speculative_config=None" in log_text:
        seen.append("the engine runs without speculative decoding (speculative_config=None)")
    if runners := _RUNNER_RE.findall(log_text):
        seen.append(f"it logged 'Using {runners[-1]} Model Runner'")
    if not seen:
        lines = [line for line in log_text.splitlines() if line.strip()]
        seen.append(f"its last line was {lines[-1][-200:]!r}" if lines else "the log is empty")
    return "; ".join(seen)


def check_aux_layers(profile: Profile, log_text: str) -> AuxLayerCheck:
    expected = expected_aux_layers(profile)
    line = find_aux_line(log_text)
    if line is None:
        return AuxLayerCheck(
            expected, None, False,
            "vLLM logged no auxiliary-layer line ('Using auxiliary layers from speculative config' on V1, "
            f"'Using Eagle3 auxiliary layers from config' on V2): {describe_instead(log_text)}; the drafter "
            "config was not read as DFlash (check architectures and dflash_config)",
            fix=NOT_DFLASH_FIX,
        )  # fmt: skip
    found, runner = line.layers, line.runner
    wanted_runner = expected_runner(profile)
    if wanted_runner and runner != wanted_runner:
        return AuxLayerCheck(
            expected, found, False,
            f"vLLM ran the {runner} model runner (its wording: 'from {line.origin}'), the profile sets "
            f"VLLM_USE_V2_MODEL_RUNNER={profile.engine.env['VLLM_USE_V2_MODEL_RUNNER']} ({wanted_runner}): "
            "the engine ignored the profile's environment (check the unit's Environment= lines)",
            runner,
            RUNNER_FIX,
        )  # fmt: skip
    if found == expected:
        return AuxLayerCheck(
            expected, found, True, f"auxiliary layers {found} = target_layer_ids + 1 ({runner} runner)", runner
        )
    shifted = tuple(i - 1 for i in found)
    if shifted == expected:
        why, fix = "shifted by +2: the +1 fix (#40727) is applied twice in this build", ENGINE_FIX
    elif found == tuple(i - 1 for i in expected):
        why, fix = "not shifted: this build lacks the +1 fix (#40727)", ENGINE_FIX
    else:
        why, fix = "the drafter's target_layer_ids differ from the profile's", LAYERS_FIX
    return AuxLayerCheck(
        expected, found, False, f"expected auxiliary layers {expected}, vLLM logged {found}: {why}", runner, fix
    )


# --------------------------------------------------------------------------- from the journal


def journal_of_current_run(unit: str) -> str:
    """The unit's log lines since its current start (its systemd invocation), from journald.
    A quadlet container logging to journald runs in the unit's cgroup, so its lines carry the
    same invocation id."""
    invocation = _run(["systemctl", "show", "--property=InvocationID", "--value", unit]).strip()
    if not invocation:
        return ""
    return _run(["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "--output=cat", "--no-pager"])


def _run(argv: list[str]) -> str:
    """A systemd tool's output (undecodable bytes replaced); a ProgramError (exit 2) where the tool
    is missing or hangs: --unit reads a systemd host's journal, --file reads a saved log."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = (
            f"did not answer within {exc.timeout:.0f} s"
            if isinstance(exc, subprocess.TimeoutExpired)
            else (f"cannot run: {exc.strerror or exc}")
        )
        raise ProgramError(
            f"--unit: `{argv[0]}` {why}: the engine's journal cannot be read on this machine",
            hint="run it on the host that runs the engine unit (systemd), or pass a saved log with --file",
        ) from None
    return done.stdout.decode("utf-8", errors="replace")


def wait_for_aux_layers(
    profile: Profile,
    read: Callable[[], str],
    *,
    timeout_s: float,
    failed: Callable[[], bool | str | None] = lambda: None,
    ready: Callable[[], bool] = lambda: False,
    poll_s: float = 2.0,
) -> AuxLayerCheck:
    """Poll the log until vLLM prints its auxiliary-layer line, or the engine fails (`failed`
    returns true or the reason), or is ready without having printed it (the line comes before
    the server answers), or time runs out."""
    started = time.monotonic()
    deadline = started + timeout_s
    text = read()
    why = ""
    while find_aux_line(text) is None:
        if reason := failed():
            why = "the engine failed before logging it" + (f" ({reason})" if isinstance(reason, str) else "")
        elif ready():
            why = "the engine is ready (its health endpoint answers) without having logged it"
        elif time.monotonic() >= deadline:
            why = f"not logged within {timeout_s:.0f} s"
        if why:
            text = read()  # the last lines, written before the state changed
            break
        time.sleep(poll_s)
        text = read()
    check = check_aux_layers(profile, text)
    if check.found is None and why:
        waited = time.monotonic() - started
        return AuxLayerCheck(
            check.expected, None, False, f"{why} (after {waited:.0f} s): {check.message}", fix=check.fix
        )
    return check


def health_answers(endpoint: str) -> Callable[[], bool]:
    """A readiness probe: the engine's `/health` answers 200 (vLLM leaves it open, key or not)."""

    def ready() -> bool:
        try:
            return httpx.get(f"{endpoint.rstrip('/')}/health", timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


def _unit_state(unit: str) -> dict[str, str] | None:
    """The unit's systemd state, or None where no such unit is loaded (or no systemd runs here)."""
    try:
        done = subprocess.run(
            ["systemctl", "show", unit, "--property=LoadState,ActiveState,SubState,Result,NRestarts,Job"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return state if state.get("LoadState") == "loaded" else None


def invocation(unit: str) -> str | None:
    """systemd's ID of the unit's current run (a new one at every start), or None where there is none."""
    try:
        done = subprocess.run(
            ["systemctl", "show", unit, "--property=InvocationID", "--value"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.strip()
    return found if done.returncode == 0 and found else None


def reader(unit: str, log_text: str | None = None) -> Callable[[], str]:
    """The engine's startup log for the smoke's served-identity check (the method vLLM serves with):
    the saved log where one is given, else the unit's journal since its current start ("" where no
    journal can be read: the method is then not checked, and the identity stage says so)."""
    if log_text is not None:
        return lambda: log_text

    def read() -> str:
        try:
            return journal_of_current_run(unit)
        except SpecdeployError:
            return ""

    return read


def unit_down(unit: str) -> Callable[[], str | None]:
    """A probe for the engine's current start: why the unit stopped trying to serve (failed, or
    crashed and waiting to restart, or restarted since the probe was made), else None.

    An engine that exits at start under `Restart=` never reads "failed" until its start limit: it loops
    through auto-restart. Without this probe the gate polled such an engine for the whole
    readiness timeout (30 minutes on the GPU profiles) and the play stopped before any rollback.
    Where the unit does not exist (a gate run by hand against another endpoint) it says nothing."""
    first = _unit_state(unit)
    restarts_at_start = int((first or {}).get("NRestarts") or 0)

    def down() -> str | None:
        state = _unit_state(unit)
        if state is None:
            return None
        active, sub, restarts = state.get("ActiveState"), state.get("SubState"), int(state.get("NRestarts") or 0)
        if active == "failed" or sub == "auto-restart" or restarts > restarts_at_start:
            return (
                f"{unit} is {active} ({sub}; result {state.get('Result')}; {restarts} automatic restarts): "
                f"the engine exits at start, see journalctl -u {unit}"
            )
        return None

    return down


def unit_changing(state: dict[str, str] | None) -> str | None:
    """Why what answers on the engine's port may be the run a queued restart is replacing — systemd
    has a job queued for the unit while the previous run is still active, or is stopping it — else
    None. Once the unit is activating, the previous run is gone and the new one answers only when it
    is up (readiness waits for that); a crash loop or a failed unit is for the readiness probe
    (`unit_down`) to name at once."""
    if state is None:
        return None
    job, active = state.get("Job", "").strip(), state.get("ActiveState")
    if active == "deactivating" or (job and active in ("active", "reloading")):
        return f"{active} ({state.get('SubState')}{'; job ' + job if job else ''})"
    return None


def wait_settled(unit: str, timeout_s: float, *, poll_s: float = 1.0) -> str | None:
    """Wait while a queued restart has not yet stopped the engine's previous run (at most
    `timeout_s`): None once it has (or none was queued), else the unit's state at the deadline.

    Failure prevented: a deploy queues the engine's restart without waiting (the play goes on while a
    large model loads), and a stopping vLLM that lets its requests in flight finish
    (`--shutdown-timeout`) still answers /health and /v1/models while it refuses new requests. A gate
    that began then judged the engine being replaced and failed on its refusals; it now starts only
    once the unit's queued restart has run."""
    deadline = time.monotonic() + timeout_s
    while (changing := unit_changing(_unit_state(unit))) is not None:
        if time.monotonic() >= deadline:
            return f"{unit} still {changing} after {timeout_s:g} s"
        time.sleep(poll_s)
    return None


def check_unit(
    profile: Profile, unit: str, *, timeout_s: float, ready: Callable[[], bool] = lambda: False
) -> AuxLayerCheck:
    """Wait for the unit's current run to log its auxiliary layers (or fail, or be ready
    without them, or time out), then check them."""
    return wait_for_aux_layers(
        profile, lambda: journal_of_current_run(unit), timeout_s=timeout_s, failed=unit_down(unit), ready=ready
    )
