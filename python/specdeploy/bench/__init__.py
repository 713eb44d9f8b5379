"""Comparing and tuning deployed stacks: one workload, measured the same way on every stack.

The field's costliest decisions were made by eye: DFlash against the MTP baseline measured with
different tools on different days (40-42 tok/s at concurrency 1 with 15 draft tokens against 73.5),
and `num_speculative_tokens` cut from 15 to 5 by hand after reading per-position acceptance.
`workload` defines what is measured and its identity (a report is comparable only with one of the
same workload); `run` runs an existing benchmark engine (`vllm bench serve`) against one
endpoint per level of concurrency and reads the engine's counters around it; `report` holds,
tables and saves the results; `compare` merges reports and refuses different workloads; `plots`
draws them; `tune` predicts the throughput of every draft length from measured runs, picks one and
writes it as a site override; `sweep` deploys and measures each k through the gate.
"""
