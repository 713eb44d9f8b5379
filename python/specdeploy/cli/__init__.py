"""The command line: one module per verb group (`profile`, `host`, `images`,
`weights`, `drafter`, `engine`, `smoke`, `rollback`, `gate`, `rehearsal`), assembled in
`app`; one error boundary and the shared options in `base`; one output helper in `output`."""

from specdeploy.cli.app import app, main

__all__ = ["app", "main"]
