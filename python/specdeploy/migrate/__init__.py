"""`specdeploy migrate`: move a serving deployment to a new host (issue 23, docs/migration.md).

Failure prevented: a host move took a week by hand and still ended with degenerate output from an
incompatible engine version, found by a person reading logs. The runbook is code: every step checks
itself, records its state (migrate.record), and no traffic reaches NEW before NEW's gate matches
OLD's last verified one (migrate.compare)."""
