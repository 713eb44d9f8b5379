"""The command line (`cli`, the last stage): one module per verb group, named by the stage
whose work it runs, in pipeline order: core (`deploylock`), profile (`profile`, `lock`),
host (`host`), images (`images`), weights (`weights`), drafter (`drafter`), engine (`engine`),
smoke (`smoke`, `coherence`), rollback (`rollback`), gate (`gate`), watch (`watch`), front
(`front`), migrate (`migrate`), bench (`bench`), rehearsal (`rehearsal`). They are assembled
in `app`; one error boundary and the shared options in `base`; one output helper in `output`.
Every stage is named here (tests/unit/test_package.py checks it)."""

from specdeploy.cli.app import app, main

__all__ = ["app", "main"]
