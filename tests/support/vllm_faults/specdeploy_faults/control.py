"""Which fault is on: the control file named by $SPECDEPLOY_FAULT_FILE, re-read whenever it changes.

The file holds one fault name (surrounding whitespace ignored); empty, absent or unset means no fault. Each
patched function asks `active()` on every call: one os.stat, and the file is read again only when its
(mtime, size, inode) changed, so a test switches faults on a running engine by rewriting the file (writing a
temporary file and renaming it over the control file is the safe way). The first call that sees a new value
logs one line to stderr, in the process that applies the fault: "specdeploy_faults: <name> active (pid N)".
"""

from __future__ import annotations

import os
import sys
import threading

ENV = "SPECDEPLOY_FAULT_FILE"
LOSSY_VERIFIER = "lossy_verifier"
LOSSY_UNDER_CONCURRENCY = "lossy_under_concurrency"
PREFIX_CACHE_SWAP = "prefix_cache_swap"
# a draft length that breaks: greedy verification accepts every draft only where the engine drafts 1 token
# a step (a deployed engine's k is its own; a sweep over k meets the fault at k=1 alone)
LOSSY_AT_K1 = "lossy_verifier_at_k1"
FAULTS = (LOSSY_VERIFIER, LOSSY_UNDER_CONCURRENCY, PREFIX_CACHE_SWAP, LOSSY_AT_K1)

_Stamp = tuple[int, int, int]

_lock = threading.Lock()
_stamp: _Stamp | None = None
_fault: str | None = None


def log(line: str) -> None:
    print(f"specdeploy_faults: {line}", file=sys.stderr, flush=True)


def path() -> str | None:
    return os.environ.get(ENV) or None


def _read(file: str) -> tuple[_Stamp | None, str | None]:
    try:
        status = os.stat(file)
    except OSError:
        return None, None
    stamp = (status.st_mtime_ns, status.st_size, status.st_ino)
    if stamp == _stamp:
        return stamp, _fault
    try:
        with open(file, encoding="utf-8") as handle:
            name = handle.read().strip()
    except OSError:
        return None, None
    if name and name not in FAULTS:
        log(f"unknown fault {name!r} in {file} (known: {', '.join(FAULTS)}): no fault active")
        return stamp, None
    return stamp, name or None


def active() -> str | None:
    """The fault switched on now, or None."""
    global _stamp, _fault
    file = path()
    if file is None:
        return None
    stamp, fault = _read(file)
    if stamp == _stamp and fault == _fault:
        return fault
    with _lock:
        if fault != _fault:
            log(f"{fault} active (pid {os.getpid()})" if fault else f"{_fault} inactive (pid {os.getpid()})")
        _stamp, _fault = stamp, fault
    return fault
