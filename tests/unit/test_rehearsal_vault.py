"""The rehearsal's secrets are kept as a site keeps them (deploy.Vault): an ansible-vault file
mapped in the inventory's group_vars, its password in an owner-only file. A plain vars file, or
a key rotated by every re-run (each rotation restarts the engine), would be a shortcut the GPU
hosts do not take."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from specdeploy.rehearsal import deploy

TOKEN, KEY = "hf_CANARY" + "3" * 20, "sk-CANARY" + "9" * 30


def test_the_vault_is_encrypted_owner_only_and_kept_across_runs(tmp_path: Path) -> None:
    vault = deploy.rehearsal_vault(tmp_path / "secrets", token=TOKEN, api_key=KEY)
    assert vault.values() == {"weights_hf_token": TOKEN, "engine_api_key": KEY}
    data = vault.file.read_bytes()
    assert data.startswith(b"$ANSIBLE_VAULT;") and TOKEN.encode() not in data and KEY.encode() not in data
    for path in (vault.file, vault.password_file):
        assert path.stat().st_mode & 0o777 == 0o600, path
    # a re-run keeps them (no rotation); generated values are kept the same way
    assert deploy.rehearsal_vault(tmp_path / "secrets").values() == vault.values()
    generated = deploy.rehearsal_vault(tmp_path / "other").values()
    assert generated == deploy.rehearsal_vault(tmp_path / "other").values()
    assert generated["weights_hf_token"].startswith("hf_") and generated["engine_api_key"].startswith("sk-")
    # ansible-vault ran as a program: ansible-core patches sys.intern on import, and torch (imported
    # later in the same test process) then refuses to load
    assert not [name for name in sys.modules if name == "ansible" or name.startswith("ansible.")]


def test_ansible_reads_the_mapped_variables_from_the_group_vars_with_the_password_file(tmp_path: Path) -> None:
    """The real ansible-playbook, on localhost: the play sees the secrets by their play names."""
    vault = deploy.rehearsal_vault(tmp_path / "secrets", token=TOKEN, api_key=KEY)
    inventory = tmp_path / "inventory" / "hosts.ini"
    inventory.parent.mkdir()
    inventory.write_text(
        f"[{deploy.VAULT_GROUP}]\nlocal ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    vault.group_vars(inventory)
    assert {p.stat().st_mode & 0o777 for p in (inventory.parent / "group_vars").rglob("*.yml")} == {0o600}
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.assert:\n"
        f"        that: [weights_hf_token == {TOKEN!r}, engine_api_key == {KEY!r}]\n"
        "        quiet: true\n"
    )
    ansible = Path(sys.executable).parent / "ansible-playbook"
    argv = [str(ansible), "-i", str(inventory), str(play), "--vault-password-file", str(vault.password_file)]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    without = subprocess.run([str(ansible), "-i", str(inventory), str(play)], capture_output=True, text=True)
    assert without.returncode != 0 and "vault" in (without.stdout + without.stderr).lower()
