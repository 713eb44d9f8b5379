"""Watching after the deploy: the light gate a systemd timer runs on each host.

The deploy's gate judges a stack once; what happens to it afterwards (acceptance collapsing
hours later, an engine that dies and is restarted, a drafter changed on disk) was found only by
a person reading logs. `specdeploy watch run` asks the engine the profile's known answers, checks
its served identity, and judges the acceptance the engine's own counters show since the previous
light gate (`counters`); it writes its result into the host's state, a textfile for
node_exporter (`textfile`, the counters re-exported with the engine unit's restart count), and
calls the host's hook when it fails (`hook`). It never restarts or rolls back anything. `units`
renders the service and timer the deploy installs.
"""
