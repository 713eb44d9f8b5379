"""The weights tests' hub helpers, which live in specdeploy.rehearsal.hub (the rehearsal
serves its fixture models from the same olah): re-exported under their old names."""

from specdeploy.rehearsal.hub import git, make_repo, olah

__all__ = ["git", "make_repo", "olah"]
