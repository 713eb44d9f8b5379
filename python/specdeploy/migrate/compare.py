"""Does NEW serve the same thing as OLD? `migrate verify`'s comparison of two gate reports.

Failure prevented: the field's last host move ended with degenerate output from an incompatible
engine version, found by a person reading logs a day later. Traffic may reach NEW only when its
passing gate report matches OLD's last verified one on every line of this table; any difference
is named with both values, and traffic stays on OLD.

| what | read from (both reports) | differs when |
|---|---|---|
| gate verdict | `verdict` | NEW's gate did not pass |
| served engine and version | smoke identity stage | not equal |
| served speculation (method, k) | smoke identity stage | not equal |
| stack identity (`IDENTITY_FIELDS`: image ID and digest, the lock's hashes...) | `golden.identity` | a field differs |
| golden transcript | OLD `golden.key`, NEW `golden.compared_with` | NEW's gate did not compare with OLD's golden |
| acceptance | acceptance stage `interval_95` | NEW's interval lies wholly below OLD's |
| decode tok/s | throughput stage | NEW's below OLD's by more than `migration.decode_rate_tolerance` |

The image ID is podman's: the image's config digest, which survives push/pull and save/load, so an
image pulled by digest from the site registry and one loaded from OLD's archive compare equal.
A report without an identity, or one acceptance interval missing, differs: nothing shows NEW is
the same. Only a decode rate one report could not measure (issue 22: "not measurable" rather than a
wrong figure), or acceptance neither measured, is reported as not compared, never as equal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

IDENTITY_FIELDS = (
    "engine", "version", "commit", "image_id", "image_digest", "lock_sha256", "serve", "speculative", "env",
)  # fmt: skip


@dataclass(frozen=True)
class Line:
    """One row of the comparison: `same` is None where it could not be compared."""

    what: str
    old: Any
    new: Any
    same: bool | None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    lines: tuple[Line, ...]

    @property
    def differences(self) -> list[Line]:
        return [line for line in self.lines if line.same is False]

    @property
    def same(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        if self.same:
            return f"NEW serves what OLD serves ({len(self.lines)} checks)"
        return "; ".join(f"{d.what}: OLD {_show(d.old)}, NEW {_show(d.new)}" for d in self.differences)

    def to_json(self) -> dict[str, Any]:
        return {"same": self.same, "lines": [line.to_json() for line in self.lines]}


def _show(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def stage(report: dict[str, Any], name: str) -> dict[str, Any]:
    """A smoke stage of a gate report ({} where the gate did not get that far)."""
    for found in (report.get("smoke") or {}).get("stages") or []:
        if found.get("name") == name:
            return found
    return {}


def _details(report: dict[str, Any], name: str) -> dict[str, Any]:
    return stage(report, name).get("details") or {}


def _served(report: dict[str, Any]) -> tuple[Any, Any]:
    ident = _details(report, "identity")
    spec = ident.get("speculation") or {}
    return (ident.get("engine"), ident.get("version")), (spec.get("method"), spec.get("k"))


def _rate(report: dict[str, Any]) -> float | None:
    rate = _details(report, "throughput").get("decode_tokens_per_s")
    return float(rate) if isinstance(rate, int | float) else None


def _interval(report: dict[str, Any]) -> tuple[float, float] | None:
    found = _details(report, "acceptance").get("interval_95")
    if isinstance(found, list | tuple) and len(found) == 2 and all(isinstance(v, int | float) for v in found):
        return float(found[0]), float(found[1])
    return None


def compare(old: dict[str, Any], new: dict[str, Any], *, decode_rate_tolerance: float) -> Comparison:
    """Compare NEW's gate report with OLD's last verified one (both as `gate.json` holds them)."""
    lines = [Line("gate verdict", old.get("verdict"), new.get("verdict"), new.get("verdict") == "pass")]
    (old_engine, old_spec), (new_engine, new_spec) = _served(old), _served(new)
    lines.append(Line("served engine and version", _pair(old_engine), _pair(new_engine), old_engine == new_engine))
    lines.append(Line("served speculation (method, k)", _pair(old_spec), _pair(new_spec), old_spec == new_spec))
    old_identity = (old.get("golden") or {}).get("identity") or {}
    new_identity = (new.get("golden") or {}).get("identity") or {}
    # a report without an identity proves nothing: NEW may not be taken for OLD's equal
    missing = [who for who, found in (("OLD", old_identity), ("NEW", new_identity)) if not found]
    note = f"{' and '.join(missing)}'s report has no identity: cannot show NEW is the same stack" if missing else ""
    for name in IDENTITY_FIELDS:
        a, b = old_identity.get(name), new_identity.get(name)
        if not missing and name not in old_identity:  # OLD's CLI predates the field: what it has is compared
            lines.append(Line(f"identity: {name}", a, b, None, "OLD's identity predates this field: not compared"))
            continue
        lines.append(Line(f"identity: {name}", a, b, not missing and a == b, note))
    old_key = (old.get("golden") or {}).get("key")
    compared = (new.get("golden") or {}).get("compared_with")
    matched = compared is not None and old_key is not None and Path(str(compared)).stem == old_key
    lines.append(
        Line(
            "golden transcript",
            old_key,
            Path(str(compared)).stem if compared else None,
            matched,
            "NEW's gate compared its outputs with OLD's golden"
            if matched
            else "NEW's gate did not compare with OLD's golden (it recorded its own: another identity)",
        )
    )
    lines.append(_acceptance(old, new))
    lines.append(_speed(old, new, decode_rate_tolerance))
    return Comparison(tuple(lines))


def _pair(values: tuple[Any, Any]) -> str:
    return " ".join(str(v) for v in values)


def _acceptance(old: dict[str, Any], new: dict[str, Any]) -> Line:
    a, b = _interval(old), _interval(new)
    if a is None and b is None:
        return Line("acceptance (95% interval)", a, b, None, "neither report measured acceptance: not compared")
    if a is None or b is None:
        who = "OLD" if a is None else "NEW"
        return Line("acceptance (95% interval)", a, b, False, f"{who}'s report has no acceptance interval: cannot "
                    "show NEW's acceptance is not lower")  # fmt: skip
    lower = b[1] < a[0]
    note = "NEW's interval lies wholly below OLD's" if lower else "the intervals overlap or NEW's is higher"
    return Line("acceptance (95% interval)", list(a), list(b), not lower, note)


def _speed(old: dict[str, Any], new: dict[str, Any], tolerance: float) -> Line:
    a, b = _rate(old), _rate(new)
    if a is None or b is None:
        return Line("decode tok/s", a, b, None, "a rate was not measurable: not compared")
    floor = a * (1 - tolerance)
    return Line(
        "decode tok/s",
        round(a, 1),
        round(b, 1),
        b >= floor,
        f"NEW may fall to {floor:.1f} ({tolerance:.0%} below OLD; the profile's migration.decode_rate_tolerance)",
    )
