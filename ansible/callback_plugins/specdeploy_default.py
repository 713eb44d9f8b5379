"""Ansible's default output with one line changed: a task retried while what it waits for still runs
says so (`waiting: [host]: its answer (attempt 3 of 961: task)`), not `FAILED - RETRYING`.

Failure prevented (issue 37, read as a person reads a deploy's log): the deploy waits for its gate in
looks of 15 s (the smoke_gate role's `gate-wait --for 15`, retried while it exits 75, the gate still
running). Ansible's default callback prints every look as `FAILED - RETRYING: [host]: Gate the new
stack (...) (959 retries left).`, so a healthy deploy's log carried a FAILED line every 15 s for the
whole gate, ninety of them in the main job's: a person scanning it for what went wrong finds them
first. Here each look says what the gate does now, from the look's own output. A task that really
fails still prints Ansible's own `fatal:` line, unchanged; everything else is the default callback's.
Set as the stdout callback by ansible.cfg (`stdout_callback`). The words of a retry come from the
package (specdeploy.core.progress.retry_words, which the progress plugin uses too); a controller without
the package gets Ansible's own retry line.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
name: specdeploy_default
type: stdout
short_description: "the default output; a retried task says it waits and on what, not FAILED - RETRYING"
description:
  - >-
    The default callback, except for a retry of an C(until) loop, which prints
    C(waiting: [host]: the attempt's last output line (attempt N of M: task)) where the controller's
    Python can import specdeploy (its words come from specdeploy.core.progress), and the default
    retry line where it cannot.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout_callback in ansible.cfg
  - specdeploy in the controller's Python for the waiting line (else the default retry line)
"""


try:  # the words of a retry are the package's, shared with the progress plugin (specdeploy_progress)
    from specdeploy.core.progress import retry_words
except ImportError:  # a controller without the package: Ansible's own retry line
    retry_words = None


def retry_line(host: str, task: str, answer: dict[str, Any]) -> str:
    """The line for one retry: the host, the attempt's last line of output (a look at the gate says
    `unit active; 12:03:40 gate: 1m00s, last: smoke: coherence prompts 7/12`), its number and the task,
    in that order: where a line is cut to its start (`migrate` shows a play's last line), what the wait
    saw stays."""
    attempt, said = retry_words(answer)
    return f"waiting: [{host}]: {said or 'no output'} ({attempt}: {task})"


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "specdeploy_default"

    def v2_runner_retry(self, result: Any) -> None:
        if retry_words is None:
            super().v2_runner_retry(result)
            return
        answer = result.result if hasattr(result, "result") else result._result
        line = retry_line(self.host_label(result), str(result.task_name or result.task), answer)
        if self._run_is_verbose(result, verbosity=2):  # as the default callback: the whole result at -vv
            line += f" Result was: {self._dump_results(answer)}"
        self._display.display(line)
