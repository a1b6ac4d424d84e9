"""Probe: which primitives of the zoo's joint graphs the cost model calls expensive or never-recompute.

A primitive the cost model does not know is EXPENSIVE (banned from recomputation at budget 1),
so an elementwise primitive new in a JAX release is saved instead of recomputed. This lists,
for the installed JAX, every forward primitive of every zoo model with its class.

Usage: python benchmarks/probe_cost_classes.py [tiny|small|gpu]
"""

from __future__ import annotations

import collections
import sys

import jax

import jaxaot
from jaxaot.partition import cost_model
from jaxaot.partition.split import EqnKind, classify_eqns

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import models as zoo_models  # noqa: E402


def main(size: str) -> None:
    seen: dict[str, set] = collections.defaultdict(set)
    for name, model in zoo_models.zoo(size).items():
        joint = jaxaot.trace_joint(model.loss, *model.make_args(jax.random.key(0)))
        eqns = jaxaot._compat.jaxpr_of(joint.jaxpr).eqns
        for eqn, kind in zip(eqns, classify_eqns(joint)):
            if kind is EqnKind.FORWARD:
                seen[(eqn.primitive.name, cost_model.classify(eqn).value)].add(name)
    print(f"# jax {jax.__version__}, zoo size {size}")
    for (prim, cls), models in sorted(seen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{cls:10s} {prim:28s} {', '.join(sorted(models))}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny")
