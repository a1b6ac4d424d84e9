"""Diagnostic tools for the GPU machine: where a step's time or memory goes (not benchmarks of record).

* ``kernel_times``: device time per kernel of JAX's and jaxaot's fused steps, from a ``jax.profiler`` trace;
* ``peak_buffers``: the temporaries live at a compiled step's peak, from its scheduled HLO;
* ``while_overhead``: where a ``checkpoints=k`` while-loop gradient spends its time (the trip-count wait);
* ``xla_rank_mismatch``: a standalone reproducer of an XLA GPU compile failure, for the report upstream.

Run each as ``python -m benchmarks.probes.<name> --help`` from the repository root.
What the retired probes found is in ``docs/benchmarks.md`` (Findings).
"""
