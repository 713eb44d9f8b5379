"""Stage 5, the drafter config: verify a downloaded drafter's config.json against the profile
and the target (`verify`), then build the serving directory the engine reads from it,
atomically and read back (`serving`)."""
