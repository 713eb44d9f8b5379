"""Stage 7, the smoke checks: is this endpoint serving the profile's stack, coherently, losslessly,
at the acceptance the profile expects? The engine clients (`clients`: vLLM, SGLang) and the answers
they read strictly (`responses`), Prometheus parsing (`metrics`), acceptance statistics and the one
mean-acceptance formula (`acceptance`), the degeneracy detectors (`coherence`), the known answers'
rules (`answers`, `gsm8k`), golden transcripts (`transcript`), one module per check (`checks`), what a
run holds (`state`), the run and its diagnosis (`run`, `diagnosis`). Read-only: it changes nothing on
the host; the gate (specdeploy.gate) decides what a verdict means for a deploy, in the one verdict
vocabulary (specdeploy.core.verdicts)."""
