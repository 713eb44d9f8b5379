"""What the deploy tests' rehearsal host is deployed with, shared by the modules that run plays on it
(test_deploy_rehearsal.py and test_watch_rehearsal.py)."""

from __future__ import annotations

MODELS = "/srv/specdeploy/models"  # not the layout's default: the inventory override must reach every stage
API_KEY = "sk-CANARY-" + "7f3a9c2e4b1d8065" * 2  # a canary: it must show up nowhere but its key file
