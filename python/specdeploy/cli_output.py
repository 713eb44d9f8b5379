"""The consoles every command prints through.

Logs (Ansible, CI) are not terminals: tables get 160 columns (or $COLUMNS) there instead of
rich's 80-column default, which would wrap field names mid-word.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
out = Console(soft_wrap=True, width=WIDTH)
err = Console(stderr=True, soft_wrap=True, width=WIDTH)
