"""Stage 0, shared by every stage: typed errors, crash-safe writes, the keeper that lets a
failed deploy be rolled back, the cache directory, and the host layout (every path and
name a deploy uses on a host, defined once)."""
