"""The rehearsal's test network gives each fixed address one MAC address for good
(specdeploy.rehearsal.hosts.mac_for): a container replaced at that address is reachable at once,
even while the controller's neighbour table still holds the entry of the one it replaced."""

from __future__ import annotations

import pytest

from specdeploy.rehearsal import deploy, hosts, hub, migration, registry

FIXED = [hub.HUB_IP, registry.REGISTRY_IP, deploy.HOST_IP, migration.NEW_IP, migration.FRONT_IP, migration.MAIN_NEW_IP]


def test_an_address_always_gets_the_same_mac_address() -> None:
    assert hosts.mac_for("10.89.64.11") == hosts.mac_for("10.89.64.11") == "02:5d:0a:59:40:0b"


@pytest.mark.parametrize("ip", FIXED)
def test_the_mac_address_is_locally_administered_and_unicast(ip: str) -> None:
    first = int(hosts.mac_for(ip).split(":")[0], 16)
    assert first & 0b10, "locally administered bit"
    assert not first & 0b01, "a multicast MAC address would not be accepted for an interface"


def test_every_fixed_address_of_the_test_network_gets_its_own_mac_address() -> None:
    assert len({hosts.mac_for(ip) for ip in FIXED}) == len(set(FIXED)) == len(FIXED)


def test_a_container_attached_at_an_address_is_given_that_address_s_mac_address() -> None:
    flags = hosts.Network("specdeploy-rehearsal", "10.89.64.30").run_flags()
    assert flags == ("--network", "specdeploy-rehearsal", "--ip", "10.89.64.30", "--mac-address", "02:5d:0a:59:40:1e")
