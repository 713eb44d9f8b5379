"""Stage 1, the profile: the single source of truth for every pin and threshold.

`schema` is the document (pydantic, provenance on every pin), `load` finds and validates
it, `lock` records the values that could only be known at first fetch or build, `facts`
prints what the Ansible roles need of it once per play, and `drafter_fields` is the
vocabulary of drafter config fields a profile can pin.
"""

from specdeploy.profile.load import SCHEMA_VERSION, list_profiles, load_profile, parse_profile, resolve_profile_path
from specdeploy.profile.schema import KnownAnswer, ModelRef, Pin, Profile, Provenance, iter_pins, unresolved_pins

__all__ = [
    "SCHEMA_VERSION",
    "KnownAnswer",
    "ModelRef",
    "Pin",
    "Profile",
    "Provenance",
    "iter_pins",
    "list_profiles",
    "load_profile",
    "parse_profile",
    "resolve_profile_path",
    "unresolved_pins",
]
