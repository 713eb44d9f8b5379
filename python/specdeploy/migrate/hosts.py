"""How `specdeploy migrate` reaches OLD and NEW: the inventory's own connection settings, read by
Ansible (`ansible-inventory --host`), turned into Fabric connections.

Failure prevented: a runbook with its own list of addresses drifts from the inventory the deploys
use, and a step runs against the wrong machine. Here both read one inventory: a host is named as
the inventory names it, and its address, port, user and key are the inventory's.

| inventory variable | Fabric |
|---|---|
| `ansible_host` (default: the name) | `host` |
| `ansible_port` (default 22) | `port` |
| `ansible_user` (default: the controller's user) | `user` |
| `ansible_ssh_private_key_file` | `connect_kwargs.key_filename` |
| `specdeploy_internal_address` (default: `ansible_host`) | where the engine publishes for the balancer |

Host keys: Fabric loads the controller's known_hosts; an unknown key is accepted only where the
inventory itself turns checking off (`-o StrictHostKeyChecking=no` in `ansible_ssh_common_args`,
as the disposable test hosts do), and refused otherwise.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core.errors import SpecdeployError
from specdeploy.core.programs import ansible_program


class InventoryError(SpecdeployError):
    exit_code = 2


@dataclass(frozen=True)
class HostAccess:
    name: str
    address: str
    port: int
    user: str | None
    key_file: str | None
    internal_address: str
    check_host_key: bool
    # everything the inventory says of the host, vault-decrypted values included: never printed
    variables: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "internal_address": self.internal_address,
        }


def _ansible_inventory() -> str:
    return str(ansible_program("ansible-inventory", why="the inventory's connection settings cannot be read"))


def host_vars(inventory: Path, name: str, *, vault_password_file: Path | None = None) -> dict[str, Any]:
    """The inventory's variables for `name` (group_vars included), as Ansible resolves them."""
    argv = [_ansible_inventory(), "-i", str(inventory), "--host", name]
    if vault_password_file is not None:
        argv += ["--vault-password-file", str(vault_password_file)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise InventoryError(
            f"inventory {inventory}: host {name!r} cannot be read: {last}",
            hint="name a host the inventory lists (`ansible-inventory -i INVENTORY --graph`); pass "
            "--vault-password-file where its group_vars are vault-encrypted",
        )
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise InventoryError(f"inventory {inventory}: ansible-inventory printed no JSON for {name!r}") from None
    return data if isinstance(data, dict) else {}


def access(inventory: Path, name: str, *, vault_password_file: Path | None = None) -> HostAccess:
    variables = host_vars(inventory, name, vault_password_file=vault_password_file)
    address = str(variables.get("ansible_host", name))
    try:
        port = int(variables.get("ansible_port", 22))
    except (TypeError, ValueError):
        raise InventoryError(
            f"inventory {inventory}: {name}: ansible_port: expected a port number, found "
            f"{variables.get('ansible_port')!r}; the host cannot be reached",
        ) from None
    common = str(variables.get("ansible_ssh_common_args", ""))
    return HostAccess(
        name=name,
        address=address,
        port=port,
        user=str(variables["ansible_user"]) if variables.get("ansible_user") else None,
        key_file=str(variables["ansible_ssh_private_key_file"])
        if variables.get("ansible_ssh_private_key_file")
        else None,
        internal_address=str(variables.get("specdeploy_internal_address", address)),
        check_host_key="StrictHostKeyChecking=no" not in common.replace(" ", ""),
        variables=variables,
    )


def connect(host: HostAccess) -> Any:
    """A Fabric connection to the host (opened lazily by Fabric on first use)."""
    import fabric  # the controller extra: only the controller runs the runbook
    import paramiko

    kwargs: dict[str, Any] = {"look_for_keys": host.key_file is None, "allow_agent": host.key_file is None}
    if host.key_file:
        kwargs["key_filename"] = host.key_file
    connection = fabric.Connection(host.address, user=host.user, port=host.port, connect_kwargs=kwargs)
    if host.check_host_key:  # Fabric itself accepts any key: check against known_hosts as ssh would
        connection.client.load_system_host_keys()
        connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return connection
