"""Benchmark: where a command's CPU time goes, by program (issue 37, item 5: where the suite's time goes).

`suite_time.py` says the suite keeps both cores busy; this says on what. It runs a command (a test module,
the suite, the main job) with the kernel's process accounting on (Debian's `acct`: `accton`, `dump-acct`),
which records every process that ends with its CPU time, its parent and its name, however short it lived:
an Ansible module's Python on a test host lives a fraction of a second, and a sampler of /proc misses it.
A sampler beside it notes each process's command line and parent every second (what accounting does not
keep), and the CPU of the processes still running at the end. Each process is then given a class from
RULES (its name, its command line, and whether it ran in a container: a test host or an engine), and the
table sums the classes.

    python benchmarks/cpu_by_program.py [--json OUT] [--log OUT] [--raw OUT] -- COMMAND [ARG...]
    python benchmarks/cpu_by_program.py --from-raw RAW [--json OUT]   # classify a kept run again

Needs root (process accounting is the whole machine's; it is turned off at the end, so stop any other
accounting first). Counts every process on the machine, the command's or not: nothing else should run
meanwhile. Not a test: the figures vary with the machine. Results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specdeploy.core import progress

HZ = os.sysconf("SC_CLK_TCK")  # /proc's ticks
ACCT_HZ = 100  # accounting's v3 records count in AHZ, always 100 a second
SAMPLE_S = 1.0
ON_A_HOST = r"^conmon$"  # an ancestor named so: the process ran in a container (a test host, an engine)
# (class, what is matched: "comm" (the process's name, 15 characters) or "cmd" (its command line),
# pattern, an ancestor's name it must have (or None)). The first rule that matches gives the class.
RULES: tuple[tuple[str, str, str, str | None], ...] = (
    ("this benchmark (its sampler)", "cmd", r"cpu_by_program\.py", None),
    ("podman (images, containers)", "comm", r"^(podman|conmon|runc|crun|catatonit|netavark|aardvark-dns|exe)$", None),
    ("vLLM engine", "comm", r"^(VLLM::|gloo_tcp_loop|pt_gloo|ZMQbg)", None),
    ("vLLM engine", "cmd", r"^VLLM::|vllm\.entrypoints|vllm\.model_executor|multiprocessing\.spawn", None),
    ("vllm bench serve", "cmd", r"bench serve|vllm\.benchmarks", None),
    ("gated hub and registry", "comm", r"^(olah|docker-registry|uvicorn)", None),
    ("gated hub and registry", "cmd", r"/opt/olah/|/opt/hub/gating\.py", None),
    ("specdeploy CLI on a host", "comm", r"^specdeploy$", ON_A_HOST),
    ("specdeploy CLI on a host", "cmd", r"bin/specdeploy |-m specdeploy ", ON_A_HOST),
    ("specdeploy CLI on the controller", "comm", r"^specdeploy$", None),
    ("specdeploy CLI on the controller", "cmd", r"bin/specdeploy |-m specdeploy ", None),
    ("Ansible modules on a host (python3)", "comm", r"^python3", ON_A_HOST),
    ("sshd", "comm", r"^(sshd|sftp-server)", None),
    ("systemd and journald", "comm", r"^(systemd|\(sd-|journal|dbus)", None),
    ("shell and utilities on a host (Ansible's commands)", "comm", r".", ON_A_HOST),
    ("Ansible controller (ansible-playbook, its workers)", "comm", r"^ansible", None),
    ("ssh client (and file copies)", "comm", r"^(ssh|scp|sftp)$", None),
    ("pip", "comm", r"^pip", None),
    ("archives (tar, gzip)", "comm", r"^(tar|gzip|zstd|xz|pigz)$", None),
    ("pytest (the tests themselves)", "cmd", r"^\[pytest-xdist|-m pytest|bin/pytest |execnet", None),
    ("kernel threads", "comm", r"^(kworker|kswapd|kcompactd|kdamond|ksoftirqd|rcu_|migration/|khugepaged)", None),
    ("other Python", "comm", r"^python", None),
)
_RULES = [
    (label, where, re.compile(pattern), re.compile(under) if under else None) for label, where, pattern, under in RULES
]


@dataclass
class Proc:
    """One process: from the sampler (command line; CPU when first and last seen) or accounting (all)."""

    pid: int
    ppid: int
    comm: str
    cmd: str = ""
    cpu_s: float = 0.0
    at_start_s: float = 0.0  # CPU it had used before the command began (seen in the first sample)


def classify(comm: str, cmd: str, ancestors: list[str]) -> str:
    """A process's class: the first of RULES its name or command line and its ancestors' names match."""
    for label, where, pattern, under in _RULES:
        if not pattern.search(comm if where == "comm" else cmd):
            continue
        if under is None or any(under.search(a) for a in ancestors):
            return label
    return f"other: {comm}"


def parse_dump_acct(text: str) -> list[Proc]:
    """`dump-acct`'s records (format v3: name|v3|user|system|elapsed|uid|gid|mem|io|pid|ppid|...; times in
    the kernel's clock ticks) as ended processes."""
    procs = []
    for line in text.splitlines():
        f = [x.strip() for x in line.rsplit("|", 14)]  # from the right: a name may hold "|"
        if len(f) != 15 or f[1] != "v3":
            continue
        procs.append(Proc(pid=int(f[9]), ppid=int(f[10]), comm=f[0], cpu_s=(float(f[2]) + float(f[3])) / ACCT_HZ))
    return procs


class Sampler(threading.Thread):
    """Every second, each process's command line, parent and CPU (by pid and start time)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[str, Proc] = {}
        self.done = threading.Event()
        self.first = True

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            right = stat.rindex(")")
            f = stat[right + 2 :].split()
            key = f"{entry.name}:{f[19]}"
            cpu = (int(f[11]) + int(f[12])) / HZ
            proc = self.seen.get(key)
            if proc is None:
                proc = self.seen[key] = Proc(
                    pid=int(entry.name), ppid=int(f[1]), comm=stat[stat.index("(") + 1 : right]
                )
                proc.at_start_s = cpu if self.first else 0.0
            proc.cpu_s = cpu
            if not proc.cmd or proc.comm.startswith(("python", "VLLM")):  # a title set after the start
                try:
                    raw = Path(f"/proc/{entry.name}/cmdline").read_bytes()
                except OSError:
                    continue
                proc.cmd = raw.replace(b"\0", b" ").decode(errors="replace")[:300] or proc.cmd
        self.first = False

    def run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(OSError, ValueError, IndexError):  # a process half gone: the next sample
                self.sample()
            self.done.wait(SAMPLE_S)


def attribute(ended: list[Proc], sampled: list[Proc]) -> dict[str, dict[str, float]]:
    """CPU seconds and process counts by class: each ended process (accounting) with its command line and
    ancestors from the sampler where it was seen, then the sampled processes still running at the end."""
    by_pid: dict[int, list[Proc]] = defaultdict(list)
    for proc in sampled:
        by_pid[proc.pid].append(proc)
    parent = {p.pid: p.ppid for p in sampled} | {p.pid: p.ppid for p in ended}
    name = {p.pid: p.comm for p in sampled} | {p.pid: p.comm for p in ended}

    def ancestors(pid: int) -> list[str]:
        out, seen = [], {pid}
        pid = parent.get(pid, 0)
        while pid and pid not in seen and len(out) < 16:
            seen.add(pid)
            out.append(name.get(pid, "?"))
            pid = parent.get(pid, 0)
        return out

    totals: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "processes": 0})
    matched: set[int] = set()
    for proc in ended:  # in the order they ended; a pid used again is another sampled process
        candidates = [c for c in by_pid.get(proc.pid, []) if id(c) not in matched]
        twin = next((c for c in candidates if c.comm[:15] == proc.comm[:15]), candidates[0] if candidates else None)
        cpu = proc.cpu_s
        if twin is not None:
            matched.add(id(twin))
            cpu -= twin.at_start_s
        row = totals[classify(proc.comm, twin.cmd if twin else "", ancestors(proc.pid))]
        row["cpu_s"] += max(cpu, 0.0)
        row["processes"] += 1
    for proc in sampled:
        if id(proc) in matched or proc.cpu_s <= proc.at_start_s:
            continue
        row = totals[classify(proc.comm, proc.cmd, ancestors(proc.pid))]
        row["cpu_s"] += proc.cpu_s - proc.at_start_s
        row["processes"] += 1
    return dict(totals)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--log", type=Path, help="the command's output (default: a temporary file)")
    parser.add_argument("--raw", type=Path, help="keep every process recorded here (for --from-raw)")
    parser.add_argument("--from-raw", type=Path, help="classify the processes of a kept run again")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress lines, also into a file
    console = Console(highlight=False)
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        known = {f.name for f in fields(Proc)}
        ended, sampled = (
            [Proc(**{k: v for k, v in p.items() if k in known}) for p in raw[part]] for part in ("ended", "sampled")
        )
        cores = raw.get("cores") or os.cpu_count() or 1
        _report(console, args.json, raw["command"], raw["exit"], raw["wall_s"], cores, attribute(ended, sampled))
        return 0
    if not command:
        parser.error("give the command to measure after --")
    missing = [p for p in ("accton", "dump-acct") if shutil.which(p) is None]
    if missing or os.geteuid() != 0:
        console.print(f"error: needs root and {', '.join(missing) or 'process accounting'} "
                      "(Debian's acct; scripts/system-deps.sh installs it)", markup=False)  # fmt: skip
        return 2
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="cpu-by-program-") as tmp:
        pacct = Path(tmp) / "pacct"
        pacct.touch()
        log = args.log or Path(tmp) / "command.log"
        sampler = Sampler()
        sampler.sample()
        sampler.start()
        code = 2
        start = time.monotonic()
        try:
            on = subprocess.run(["accton", str(pacct)], check=False, capture_output=True, text=True)
            if on.returncode != 0:
                console.print(f"error: accton {pacct} refused ({on.stderr.strip()}): process accounting is off "
                              "here (a container without CAP_SYS_PACCT, a kernel without BSD accounting)",
                              markup=False)  # fmt: skip
                return 2
            # the project's ticker: a line every 20 s naming the command's last line (no silent minutes)
            with log.open("w") as out, progress.step(f"cpu-by-program: {' '.join(command)[:60]}"):
                code = progress.timed_run(command, echo=out).returncode
        except OSError as exc:  # the command's program is missing or cannot run
            console.print(f"error: cannot run {command[0]}: {exc}", markup=False)
            return 2
        finally:
            subprocess.run(["accton", "off"], check=False, capture_output=True)
            sampler.done.set()
            sampler.join()
        wall = time.monotonic() - start
        dumped = subprocess.run(["dump-acct", str(pacct)], check=False, capture_output=True, text=True)
        if dumped.returncode != 0:
            console.print(f"error: dump-acct {pacct}: {dumped.stderr.strip()}", markup=False)
            return 2
        ended = parse_dump_acct(dumped.stdout)
    sampled = list(sampler.seen.values())
    if args.raw:
        kept = {"command": command, "exit": code, "wall_s": round(wall, 1), "cores": cores}
        kept |= {"ended": [asdict(p) for p in ended], "sampled": [asdict(p) for p in sampled]}
        args.raw.write_text(json.dumps(kept) + "\n")
    _report(console, args.json, command, code, wall, cores, attribute(ended, sampled))
    return code


def _report(
    console: Console,
    json_out: Path | None,
    command: list[str],
    code: int,
    wall: float,
    cores: int,
    totals: dict[str, dict[str, float]],
) -> None:
    """The table by class, and the figures as JSON when asked."""
    total = sum(row["cpu_s"] for row in totals.values())
    table = Table(title=escape(f"CPU by program: {' '.join(command)[:80]} (exit {code}, {wall:.0f} s wall)"))
    for column in ("class", "CPU s", "share", "processes"):
        table.add_column(column, justify="left" if column == "class" else "right")
    for label, row in sorted(totals.items(), key=lambda kv: -kv[1]["cpu_s"]):
        if row["cpu_s"] >= 0.5:
            table.add_row(
                escape(label), f"{row['cpu_s']:.1f}", f"{100 * row['cpu_s'] / total:.1f}%", str(int(row["processes"]))
            )
    table.add_row("all", f"{total:.1f}", f"{100 * total / (wall * cores):.0f}% of the cores", "")
    console.print(table)
    if json_out:
        json_out.write_text(json.dumps({"command": command, "exit": code, "wall_s": round(wall, 1),
                                         "cores": cores, "cpu_s": round(total, 1),
                                         "classes": totals}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
