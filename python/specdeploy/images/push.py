"""Build once, ship everywhere: push the built engine image to the site's registry and record its digest.

Hosts that each build their own image serve images nobody compared (the field's host move ended
on an engine nobody had proven); the documented flow builds on one builder, pushes here, and
every host pulls `NAME@DIGEST` (`image ensure --source pull`). The digest comes from podman's own
`--digestfile` (the registry's manifest digest), never from a tag lookup, and is recorded in the
lock as `engine.image.digest`: a later push of different bytes under the same pins is refused as a
lock mismatch, naming both digests.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import files
from specdeploy.core.references import in_registry, registry_of
from specdeploy.images import build
from specdeploy.images.build import ImageError, image_tag, podman_run, require_image
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock

DIGEST_KEY = "engine.image.digest"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass
class Pushed:
    tag: str
    destination: str  # the name:tag pushed to
    digest: str  # the registry's manifest digest
    reference: str  # NAME@DIGEST: what a host pulls
    image_id: str
    recorded: bool  # whether the lock gained the digest now


def push(
    profile: Profile,
    *,
    lock: Lock,
    registry: str | None = None,
    podman: str = "podman",
    cert_dir: Path | None = None,
    tls_verify: bool = True,
) -> Pushed:
    """Push the profile's built image to the site's `registry` (host[:port]; default: the one its
    name names) under the image's repository and tag, then record the registry's digest."""
    require_image(profile)
    assert profile.engine.image is not None
    name = in_registry(profile.engine.image.name, registry)
    if registry_of(name) is None:
        raise ImageError(
            f"no registry to push {profile.engine.image.name} to: --registry is not given and the profile's "
            "engine.image.name names none (expected REGISTRY[:PORT]/PATH); nothing was pushed",
            hint="pass --registry HOST[:PORT], the site's registry, or ship an archive (podman save) to "
            "air-gapped hosts instead (images_source: archive)",
        )
    if cert_dir is not None:
        files.directory(
            cert_dir,
            option="--cert-dir",
            what="a directory holding the registry's CA (ca.crt)",
            hint="see podman-push(1)",
        )
    tag = image_tag(profile)
    if build.local_digest(tag, podman) is None:
        raise ImageError(
            f"{tag} is not on this machine: nothing to push",
            hint=f"build it first: specdeploy image build --profile {profile.name}",
        )
    destination = f"{name}:{tag.rsplit(':', 1)[1]}"
    digest = push_reference(tag, destination, podman=podman, cert_dir=cert_dir, tls_verify=tls_verify)
    recorded = lock.record(profile.name, DIGEST_KEY, digest, by="image push", detail={"pushed_to": destination})
    image_id = f"sha256:{build.local_id(tag, podman)}"
    return Pushed(tag, destination, digest, f"{name}@{digest}", image_id, recorded)


def push_reference(
    source: str, destination: str, *, podman: str = "podman", cert_dir: Path | None = None, tls_verify: bool = True
) -> str:
    """`podman push SOURCE docker://DESTINATION`; the registry's manifest digest from `--digestfile`."""
    with tempfile.TemporaryDirectory(prefix="specdeploy-push-") as tmp:
        digestfile = Path(tmp) / "digest"
        done = podman_run(
            podman,
            "push",
            "--quiet",
            f"--tls-verify={'true' if tls_verify else 'false'}",
            *(["--cert-dir", str(cert_dir)] if cert_dir is not None else []),
            "--digestfile",
            str(digestfile),
            source,
            f"docker://{destination}",
        )
        if done.returncode != 0:
            raise ImageError(
                f"podman push {source} to {destination} failed: {done.stderr.strip()[-500:]}",
                hint="is the registry reachable from here, its CA trusted (--cert-dir), and are you logged in "
                "(podman login) where it needs credentials?",
            )
        digest = files.read_text(digestfile, what="podman's digest file", limit=4096).strip()
    if not _DIGEST.fullmatch(digest):
        raise ImageError(f"podman push wrote {digest!r} as the digest of {destination}: expected sha256:<64 hex>")
    return digest
