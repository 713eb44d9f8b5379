"""Stage 8, the rollback: put back what a failed deploy run replaced (the keeper kept it, see
core.keeper), restart the previous engine and prove it serves with its own smoke (`restore`)."""
