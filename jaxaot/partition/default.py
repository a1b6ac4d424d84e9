"""Partitioners: functions ``JointGraph -> Partition`` that choose what to save.

A partitioner only chooses the saved set; :func:`jaxaot.partition.split_joint`
builds the programs. Pass one to ``aot_function(..., partition_fn=...)``.
"""

from __future__ import annotations

from jaxaot.partition.split import Partition, forward_values_used_by_backward, split_joint
from jaxaot.tracing.joint import JointGraph


def default_partition(joint: JointGraph) -> Partition:
    """Save every forward value the backward reads, as JAX's own ``jax.vjp`` does.

    Values are saved once each; inputs are captured rather than re-emitted, and
    values that are already outputs are not emitted twice. Constant-only values
    (zeros for unused inputs, iotas) are recomputed in the backward.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> joint = jaxaot.trace_joint(lambda x: jnp.sin(x).sum(), jnp.ones(3))
        >>> p = jaxaot.default_partition(joint)
        >>> [(r.source, r.producer) for r in p.residuals]  # sin's derivative, computed in the forward
        [('temporary', 'cos')]
    """
    return split_joint(joint, forward_values_used_by_backward(joint))
