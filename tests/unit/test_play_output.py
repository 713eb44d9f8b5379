"""Reading a play's output (the default callback's) for what ran where and in which order: the
rolling deploy's test asserts each host was drained, restarted, gated and put back before the next
one was touched, from these events."""

from __future__ import annotations

from specdeploy.rehearsal import deploy

# the shape ansible-core's default callback prints (delegated lines name both hosts; a loop's items
# each get a line; a failure is "fatal: [host]: FAILED! => ...")
OUTPUT = """\
PLAY [Deploy a specdeploy stack] ***********************************************

TASK [front : Drain this host from the site's front door (its requests in flight finish first)] ***
changed: [old-host -> front-host]

TASK [engine : Render the unit] ************************************************
ok: [old-host]

RUNNING HANDLER [engine : Restart the engine] **********************************
changed: [old-host]

TASK [weights : Verify] ********************************************************
changed: [old-host] => (item=a.safetensors)
skipping: [old-host] => (item=b.safetensors)

TASK [smoke_gate : Gate the new stack] *****************************************
fatal: [old-host]: FAILED! => {"changed": false, "msg": "ok: [not a host line]"}

PLAY RECAP *********************************************************************
old-host                   : ok=3    changed=3    unreachable=0    failed=1    skipped=1
"""


def test_each_result_line_becomes_a_task_status_and_host_event_in_order() -> None:
    assert deploy.task_events(OUTPUT) == [
        ("front : Drain this host from the site's front door (its requests in flight finish first)", "changed",
         "old-host"),
        ("engine : Render the unit", "ok", "old-host"),
        ("engine : Restart the engine", "changed", "old-host"),
        ("weights : Verify", "changed", "old-host"),
        ("weights : Verify", "skipping", "old-host"),
        ("smoke_gate : Gate the new stack", "fatal", "old-host"),
    ]  # fmt: skip


def test_changed_tasks_are_the_changed_events_handlers_and_loop_items_included() -> None:
    assert deploy.changed_tasks(OUTPUT) == [
        "front : Drain this host from the site's front door (its requests in flight finish first)",
        "engine : Restart the engine",
        "weights : Verify",
    ]
