"""Git repositories shaped like vLLM (main plus a PR commit), for the build-guard tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from specdeploy.images import guards

SHIFT = "layer_ids = [\n    i + 1 for i in (dflash_config.get('target_layer_ids') or [])\n]\n"


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env={**os.environ, **env}
    ).stdout.strip()


def fixture_vllm_repo(root: Path, *, shifts: int = 1, touch_native: bool = False) -> tuple[Path, str, str]:
    """A git repo shaped like vLLM: main (the merge-base) plus a PR commit on top.
    Returns (repo, pr_head, merge_base)."""
    repo = root / "vllm"
    runner = repo / guards.SHIFT_FILE
    runner.parent.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    runner.write_text("# model runner\n")
    (repo / "setup.py").write_text("# setup\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "main")
    merge_base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "pr")
    runner.write_text("# model runner\n" + SHIFT * shifts)
    (repo / "dflash_swa.py").write_text("# the PR's Python change\n")
    if touch_native:
        (repo / "csrc").mkdir()
        (repo / "csrc" / "attention.cu").write_text("// kernel\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "pr")
    return repo, git(repo, "rev-parse", "HEAD"), merge_base
