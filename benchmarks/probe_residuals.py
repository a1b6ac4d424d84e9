"""Probe: what the min-cut saves against what dots_saveable saves, for one zoo model.

Prints, per budget, the residual table of ``aot_function(...).lower()`` (value,
bytes, producer, source line) and JAX's own list for ``dots_saveable``
(``print_saved_residuals``), so a budget that is slower than the policy at the
same bytes can be traced to the values it chose. Tracing and partitioning only.

Usage: python benchmarks/probe_residuals.py NAME [budget ...]   (NAME: a zoo model, GPU sizes)
"""

from __future__ import annotations

import functools
import sys

import jax
from jax.ad_checkpoint import print_saved_residuals

import jaxaot

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import models as zoo_models  # noqa: E402


def main(argv: list[str]) -> None:
    name, budgets = argv[0], [float(b) for b in argv[1:]] or [1.0]
    model = next(m for m in zoo_models.zoo("gpu").values() if name in m.name)
    args = model.make_args(jax.random.key(0))
    print(f"# {model.label}, jax {jax.__version__}")
    for b in budgets:
        pf = functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=b)
        low = jaxaot.aot_function(model.loss, partition_fn=pf).lower(*args)
        print(f"\n## min-cut {b:g}: {low.saved_bytes / 2**20:.1f} MiB")
        print(low.residuals)
    print("\n## dots_saveable")
    print_saved_residuals(jax.checkpoint(model.loss, policy=jax.checkpoint_policies.dots_saveable), *args)


if __name__ == "__main__":
    main(sys.argv[1:])
