"""Stage 6, the engine service: the one renderer of a profile into the engine's argv and
environment (`args`), the systemd/quadlet unit built from it (`units`), and the startup-log
check that proves the drafter is wired as the profile says (`startup_log`)."""
