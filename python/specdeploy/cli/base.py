"""What every command module shares: the command-group class, the options every verb group
uses, and the single error boundary.

The boundary sits on the root group (`Boundary`): every `SpecdeployError` becomes its
message, its hint and its exit code; any other exception is a bug in specdeploy and becomes
one line naming the command and the exception, with exit code 70 (`--debug` or
`SPECDEPLOY_DEBUG=1` adds the traceback). No command catches errors itself.
"""

from __future__ import annotations

import contextlib
import traceback
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from specdeploy.cli import output
from specdeploy.core import layout
from specdeploy.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, SpecdeployError, UsageError
from specdeploy.profile.lock import Lock, default_lock_path

COMMAND_PATH = "specdeploy.command"


class Group(TyperGroup):
    """A verb group that records which subcommand runs, so an error can name it."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        if name:
            ctx.meta.setdefault(COMMAND_PATH, []).append(name)
        return name, command, rest


class Boundary(Group):
    """The root group: the one place errors become messages and exit codes."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # exits, usage errors and aborts: typer reports them
        except SpecdeployError as exc:
            output.error(exc)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            output.err.print("interrupted", highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:
            command = " ".join(["specdeploy", *ctx.meta.get(COMMAND_PATH, [])])
            debug = bool((ctx.obj or {}).get("debug"))
            if debug:
                output.err.print("".join(traceback.format_exception(exc)), highlight=False, markup=False)
            hint = "with the traceback above" if debug else "with the traceback that --debug prints"
            what = " ".join(str(exc).split())  # one line, whatever the exception's message holds
            output.err.print(
                f"internal error in {command}: {type(exc).__name__}: {what} — a bug in specdeploy: please report it "
                f"{hint}",
                highlight=False,
                markup=False,
            )
            raise typer.Exit(EXIT_INTERNAL) from None


def group(help_text: str) -> typer.Typer:
    """A verb group (`specdeploy image ...`) that names its subcommands in error messages."""
    return typer.Typer(cls=Group, no_args_is_help=True, help=help_text, pretty_exceptions_enable=False)


# --------------------------------------------------------------------------- shared options

ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="profile name or path to a .yaml file")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
LockOpt = Annotated[
    Path | None,
    typer.Option("--lock", help="lock file (default: $SPECDEPLOY_LOCK or ./specdeploy.lock)"),
]
RollbackDirOpt = Annotated[
    Path | None,
    typer.Option("--rollback-dir", help="keep what this step replaces here, for the gate's rollback"),
]
CheckOpt = Annotated[
    bool,
    typer.Option("--check/--no-check", help="change nothing: report whether it would change (ansible --check)"),
]
RunIdOpt = Annotated[str, typer.Option("--run-id", help="the deploy run the kept copies belong to")]
PodmanOpt = Annotated[str, typer.Option(help="podman executable")]
UnitOpt = Annotated[str, typer.Option(help="the engine's systemd unit")]
ModelsDirOpt = Annotated[str | None, typer.Option(help="models directory on the host (default: the host layout's)")]
ServingDirOpt = Annotated[str | None, typer.Option(help="serving directory on the host (default: the host layout's)")]
StateDirOpt = Annotated[str | None, typer.Option(help="state directory on the host (default: the host layout's)")]
CacheDirOpt = Annotated[
    str | None, typer.Option(help="engine cache directory on the host (default: the host layout's)")
]


# An input file the command reads: missing, a directory or unreadable is a usage error (exit 2)
# that names the option, never a traceback.
InputFile = {"exists": True, "dir_okay": False, "readable": True}


def lock_at(path: Path | None) -> Lock:
    return Lock(path or default_lock_path())


PublishHostOpt = Annotated[
    str | None,
    typer.Option(
        help="the engine host's internal address, where its listener serves the front over mutual TLS (default "
        f"none: {layout.DEFAULT_PUBLISH_HOST}, the engine on the host's loopback only; docs/front.md)"
    ),
]


def one_balancer(socket: Path | None, hook: Path | None, *, hook_flag: str) -> None:
    """Refuse a front's HAProxy socket and a site's balancer hook given together: each names a balancer."""
    if socket is not None and hook is not None:
        raise UsageError(
            f"--socket {socket} and {hook_flag} {hook} name two balancers: expected one",
            hint=f"--socket for the front's HAProxy (or neither: its default socket), {hook_flag} for a site's own",
        )


def writing(what: str, *, state_dir: str | None = None, check: bool = False) -> AbstractContextManager[None]:
    """The host's deploy lock around a verb that writes the host (core.deploylock): the verb's own for
    its duration, refused while another run holds the host; nothing to take under the play that holds
    it (its run id in SPECDEPLOY_DEPLOY_RUN), with --check, or where nothing was deployed (no state
    directory)."""
    from specdeploy.core import deploylock

    if check:
        return contextlib.nullcontext()
    return deploylock.held(host_layout(state_dir=state_dir).state, what)


def host_layout(
    models_dir: str | None = None,
    serving_dir: str | None = None,
    state_dir: str | None = None,
    cache_dir: str | None = None,
) -> layout.HostLayout:
    """The host layout with the overrides given on the command line (empty means default)."""
    return layout.HostLayout.of(models=models_dir, serving=serving_dir, state=state_dir, cache=cache_dir)
