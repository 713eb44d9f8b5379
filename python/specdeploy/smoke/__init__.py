"""Stage 7, the smoke checks: is this endpoint serving the profile's stack, coherently, at the
acceptance the profile expects? The engine clients (`clients`: vLLM, SGLang), Prometheus
parsing (`metrics`), acceptance statistics (`acceptance`), the degeneracy detectors
(`coherence`) and the staged run with its diagnosis (`stages`). Read-only: it changes nothing
on the host; the gate (specdeploy.gate) decides what a verdict means for a deploy."""
