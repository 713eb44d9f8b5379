"""Stage 2, the host: can this machine run the profile? Preflight (GPUs, compute capability,
driver, NVLink, disk, podman, port, token), the nvidia-smi parsers it reads the GPUs with,
and the CUDA-to-driver table."""
