"""Stage 10, the CPU rehearsal: the same pipeline on a machine without a GPU — fixture models
(`fixtures`, `corpus`, `archive`), profile variants derived in code (`variants`), real
vLLM-CPU stacks (`install`, `launcher`, `stacks`), the DFlash proof (`proof`), disposable
systemd hosts (`hosts`) and the main job that deploys to one through Ansible (`deploy`)."""
