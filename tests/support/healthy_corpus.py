"""Healthy real text gathered offline from what installed packages ship, for measuring the
coherence detectors' false-positive rate: translated message catalogs (many languages),
Python standard-library source (code), and package long descriptions (markdown/rst prose).
The selection is deterministic (sorted paths, fixed chunk sizes)."""

from __future__ import annotations

import gettext
import sysconfig
from importlib import metadata
from pathlib import Path

LANGUAGES = (
    "de",
    "fr",
    "es",
    "ru",
    "uk",
    "ja",
    "zh_CN",
    "ko",
    "el",
    "pl",
    "cs",
    "tr",
    "vi",
    "pt_BR",
    "it",
    "sv",
)


def catalog_texts(per_language: int = 6, size: int = 600) -> list[tuple[str, str]]:
    """Paragraphs of translated messages from /usr/share/locale/<lang>/LC_MESSAGES/*.mo."""
    out: list[tuple[str, str]] = []
    for lang in LANGUAGES:
        files = sorted(Path("/usr/share/locale", lang, "LC_MESSAGES").glob("*.mo"))
        taken = 0
        for mo in files:
            try:
                with mo.open("rb") as fh:
                    catalog = gettext.GNUTranslations(fh)._catalog  # read-only use of the parsed catalog
            except (OSError, UnicodeDecodeError):
                continue
            messages = [
                v
                for k, v in sorted(catalog.items(), key=lambda kv: str(kv[0]))
                if k and isinstance(v, str) and len(v) > 20
            ]
            text = "\n".join(messages)[:size]
            if len(text) >= 200:
                out.append((f"catalog:{lang}", text))
                taken += 1
            if taken >= per_language:
                break
    return out


def stdlib_code(count: int = 60, size: int = 1500) -> list[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > size)
    return [("code", f.read_text(errors="replace")[:size]) for f in files[:count]]


def package_descriptions(count: int = 80, size: int = 2000) -> list[tuple[str, str]]:
    out = []
    for dist in sorted(metadata.distributions(), key=lambda d: d.metadata["Name"].lower()):
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if len(body) >= 400:
            out.append(("markdown", body[:size]))
        if len(out) >= count:
            break
    return out


def gather() -> list[tuple[str, str]]:
    return catalog_texts() + stdlib_code() + package_descriptions()
