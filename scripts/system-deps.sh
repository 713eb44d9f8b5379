#!/usr/bin/env bash
# System packages the tests need (Debian): podman + runc for image builds and disposable
# test hosts, busybox-static and debootstrap for local base images, nix-bin to parse the
# flake, git-lfs for the hub-mirror repositories of the fetch tests, prometheus for promtool (the
# alert rules' tests), haproxy and openssl for the site's front door (its tests run the real
# HAProxy over TLS), acct for a CPU benchmark, python3 (with venv) for scripts/setup.sh.
# Installs only what is missing; needs root (CI and these machines run as root).
# tests/unit/test_programs.py checks every program the tests and scripts run is installed here
# (or says where else it comes from).
set -euo pipefail
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v nix-instantiate >/dev/null || need+=(nix-bin)
command -v git >/dev/null || need+=(git)
# git-lfs: the fetch tests build LFS objects for the hub mirror (olah reads .git/lfs/objects).
command -v git-lfs >/dev/null || need+=(git-lfs)
command -v ssh >/dev/null || need+=(openssh-client)
command -v flock >/dev/null || need+=(util-linux)
# gcc: the CUDA guard's tests link real ELF objects (a stub libcudart.so.N and an extension needing it).
command -v gcc >/dev/null || need+=(gcc)
# promtool checks and unit-tests the alert rules (monitoring/): Debian ships it in `prometheus`
# (bookworm 2.42.0, 19 MB; the server's binary comes along, never started for the tests).
command -v promtool >/dev/null || need+=(prometheus)
# haproxy: the site's front door (python/specdeploy/front): `haproxy -c` checks each rendered
# haproxy.cfg, and the front's tests run the real HAProxy on loopback (bookworm 2.6.12, 2 MB download).
# The package enables and starts its own service where systemd runs: disabled below.
command -v haproxy >/dev/null || need+=(haproxy)
# openssl: the front's tests make a throwaway self-signed certificate with it.
command -v openssl >/dev/null || need+=(openssl)
# iptables: the listener's test makes a dead engine's port swallow connections (a DROP rule on loopback,
# removed after it), as podman's forwarded port does for a moment after its container is killed.
command -v iptables >/dev/null || need+=(iptables)
# acct: process accounting (accton, dump-acct) for benchmarks/cpu_by_program.py, which says where a
# command's CPU goes by program. Its package turns accounting on where systemd runs: turned off below.
command -v accton >/dev/null || need+=(acct)
command -v dump-acct >/dev/null || need+=(acct)
# python3 builds the venv (scripts/setup.sh); `python3 -m venv` needs ensurepip: Debian's python3-venv.
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "system-deps: installing ${need[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "system-deps: need root to install ${need[*]} (or install them yourself)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  # Where systemd runs, the prometheus package enables and starts its server (port 9090): only
  # promtool is wanted here.
  if [[ " ${need[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service >&2 || true
  fi
  # Likewise haproxy's package starts its service with Debian's default haproxy.cfg: the front is
  # run from the rendered file only (tests start their own HAProxy on loopback ports).
  if [[ " ${need[*]} " == *" haproxy "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now haproxy.service >&2 || true
  fi
  # acct's package turns machine-wide accounting on (its service, or its init script where systemd does not
  # run, and cron.daily after): only the benchmark turns it on, for its own run.
  if [[ " ${need[*]} " == *" acct "* ]]; then
    if [ -d /run/systemd/system ]; then
      systemctl disable --now acct.service >&2 || true
    else
      accton off >&2 || true
    fi
    # the file is sourced: a later assignment wins
    if [ -f /etc/default/acct ]; then printf 'ACCT_ENABLE="0"\n' >>/etc/default/acct; fi
  fi
fi
