"""Stage 4, weights: the target and the drafter fetched at their pinned revisions with
huggingface_hub, every file proven against the hub's hash and the lock (`fetch`)."""
