"""Which NVIDIA driver a CUDA version needs: host knowledge, read by preflight and the image build.

An image whose CUDA is newer than the host's driver supports does not start at all; the
A6000 hosts run pre-R580 drivers, which is why their profiles take CUDA 12.9 bases. The
table is NVIDIA's minimum driver branch per CUDA major version (docs/sources.md#cuda-and-drivers).
"""

from __future__ import annotations

from specdeploy.profile.schema import cuda_version  # the one rule, kept with the profile it reads

__all__ = ["MIN_DRIVER_FOR_CUDA", "cuda_major", "cuda_version", "min_driver_branch"]

# CUDA major version -> the oldest driver branch that runs it
MIN_DRIVER_FOR_CUDA = {12: 535, 13: 580}


def cuda_major(base_image: str) -> int | None:
    """The CUDA major version an image name declares, or None."""
    version = cuda_version(base_image)
    return int(version.split(".")[0]) if version else None


def min_driver_branch(base_image: str) -> int | None:
    """The oldest driver branch that runs an image built on `base_image`, or None when unknown."""
    return MIN_DRIVER_FOR_CUDA.get(cuda_major(base_image) or 0)
