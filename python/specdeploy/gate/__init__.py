"""Stage 9, the gate: the deploy's last step and its verdict (`run`): the startup-log check,
the smoke checks and, on failure, the rollback with its proof — one report per run under
`<state>/runs/<run-id>/`, and `<state>/verified` pointing at the last run that passed."""
