"""No silent minutes in a play: while a task runs, a line every 20 s naming the task, its time so far,
the hosts it still waits on and the last answer the controller saw.

Failure prevented (issue 37): Ansible prints a task's result only when it ends, so a deploy sat silent
for minutes on the engine image's pull, the weights' download, the engine's start and the gate, and a
person could not tell a hung host from a slow one (`migrate prepare` printed nothing for nine minutes).

The ticker is the package's (specdeploy.core.progress.Step, the same one the main job and `migrate` use);
this plugin only tells it what the controller observes: which hosts started the task, which answered
and how (ok, changed, failed, an item of a loop, a retry with its message). Enabled for every play of
this directory by ansible.cfg (`callbacks_enabled`); it adds lines and changes none of the default
output. A controller whose Python lacks specdeploy gets a warning and the default output only.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: specdeploy_progress
type: aggregate
short_description: a progress line every 20 s while a task runs (the task, its time, hosts waited on, last answer)
description:
  - While a task runs, prints at least every 20 s (SPECDEPLOY_PROGRESS_PERIOD_S may shorten it) a line naming
    the task, how long it has run, the hosts it waits on and the last result or retry the controller saw.
requirements:
  - specdeploy installed in the controller's Python (specdeploy.core.progress)
"""

try:
    from specdeploy.core import progress
    from specdeploy.core.progress import last_said, retry_words  # an older package without them: as without it
except ImportError:  # a controller without the package: default output only
    progress = None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "specdeploy_progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._task = ""
        self._step: Any = None
        self._running: list[str] = []
        # ansible-core calls some of these on its results thread, others on the main one
        self._lock = threading.RLock()
        if progress is None:
            self._display.warning("specdeploy_progress: specdeploy is not importable here; no progress lines")

    # ------------------------------------------------------------------ the ticker

    def _write(self, text: str) -> None:
        self._display.display(text)
        sys.stdout.flush()  # Ansible lets the system flush: into a pipe or a log that is minutes late

    def _begin(self, name: str) -> None:
        with self._lock:
            self._end()
            self._task, self._running = name, []

    def _end(self) -> None:
        with self._lock:
            if self._step is not None:
                self._step.stop()
                self._step = None

    def _seen(self, host: str, what: str, *, done: bool) -> None:
        with self._lock:
            self._see(host, what, done=done)

    def _see(self, host: str, what: str, *, done: bool) -> None:
        if done and host in self._running:
            self._running.remove(host)
        if progress is None:
            return
        if self._step is None and (self._running or not done):
            self._step = progress.Step(f"TASK [{self._task}]", write=self._write, announce=False).start()
        if self._step is None:
            return
        if done and not self._running:  # every host that started it has answered: the default output says how
            self._end()
            return
        waiting = f"; waiting on {', '.join(self._running)}" if self._running else ""
        self._step.observe(f"{host}: {what}{waiting}")

    @staticmethod
    def _message(result: Any) -> str:
        """The last line a result says: the module's message, else a command's stderr or stdout."""
        if progress is None:  # no package (no step to report to either)
            return ""
        return last_said(result.result if hasattr(result, "result") else result._result, "msg", "stderr", "stdout")

    @staticmethod
    def _host(result: Any) -> str:
        host = result.host if hasattr(result, "host") else result._host
        return host.get_name()

    # ------------------------------------------------------------------ what the controller sees

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._begin(task.get_name().strip())

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._begin(f"{task.get_name().strip()} (handler)")

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._end()

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._end()

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        name = host.get_name()
        with self._lock:
            self._running.append(name)
            self._see(name, "started", done=False)

    def v2_runner_on_ok(self, result: Any, **_: Any) -> None:
        answer = result.result if hasattr(result, "result") else result._result
        self._seen(self._host(result), "changed" if answer.get("changed") else "ok", done=True)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._seen(self._host(result), f"failed: {self._message(result)}", done=True)

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._seen(self._host(result), "skipped", done=True)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._seen(self._host(result), f"unreachable: {self._message(result)}", done=True)

    def v2_runner_retry(self, result: Any) -> None:
        if progress is None:
            return
        attempt, said = retry_words(result.result if hasattr(result, "result") else result._result)
        self._seen(self._host(result), f"{attempt}{': ' + said if said else ''}", done=False)

    def v2_runner_item_on_ok(self, result: Any) -> None:
        label = self._get_item_label(result.result if hasattr(result, "result") else result._result)
        self._seen(self._host(result), f"item {label} done", done=False)

    def v2_runner_item_on_failed(self, result: Any) -> None:
        label = self._get_item_label(result.result if hasattr(result, "result") else result._result)
        self._seen(self._host(result), f"item {label} failed", done=False)
