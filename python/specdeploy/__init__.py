"""specdeploy: reproducible deployment of LLM serving with speculative decoding.

The package reads as the pipeline, one folder per stage, imports running one way (down; the
order is tests/unit/test_package.py's STAGES, and that test checks this table names each):

    core       errors, atomic writes, file primitives, the keeper and run ids, the host layout (shared by all)
    profile    the single source of truth: schema, load, lock (and its entries), facts
    host       preflight, GPU inventory, the CUDA-to-driver table
    images     engine images built from the profile's pins; in-build guards
    weights    pinned downloads, every file verified
    drafter    verify-config, and the serving directory built from a verified download
    engine     engine argv, the systemd/quadlet unit, the startup-log check
    smoke      the smoke checks (clients, metrics, acceptance, coherence, stages)
    rollback   restore what a failed run replaced, prove the previous stack serves
    gate       the deploy's verdict: startup log + smoke + rollback, one report per run
    watch      the light gate a systemd timer runs on each host after the deploy
    front      the site's front door: HAProxy before the engine hosts, each host's listener
    migrate    move a serving deployment to a new host, every step checking itself
    bench      one workload measured the same way on every stack: compare, sweep, tune
    rehearsal  the CPU rehearsal: fixture models, vLLM-CPU stacks, test hosts, the main job
    cli        `specdeploy`, one module per verb group
"""

__version__ = "0.1.0"
