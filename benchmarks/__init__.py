"""jaxaot's benchmarks: maintained scripts that time jaxaot against JAX's own options.

Run one from the repository root as ``python -m benchmarks.bench_<name> [--small]``, or several on
a GPU machine with ``benchmarks/run_gpu.sh``; ``docs/benchmarks.md`` holds each one's current table.
``models`` is the model zoo the benchmarks and the tests share (``from benchmarks import models``),
``harness`` the timing and reporting helpers, ``probes`` the diagnostic tools.
"""
