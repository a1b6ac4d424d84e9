"""The default partition, and ``differentiate``: the split JAX's own ``jax.vjp`` makes.

:func:`default_partition` saves every forward value the backward reads.
:func:`differentiate` is JAX's counterpart of TorchScript's ``differentiate()``:
the same split, returned as a :class:`Gradient` (the forward ``f``, the backward
``df`` and the bookkeeping that wires them together, named TorchScript's way).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxaot.errors import InvalidInputError
from jaxaot._src.partition.core.split import Partition, check_joint, forward_values_used_by_backward, split_joint
from jaxaot._src.tracing import JointGraph, trace_joint


def default_partition(joint: JointGraph) -> Partition:
    """Save every forward value the backward reads, as JAX's own ``jax.vjp`` does.

    Values are saved once each; inputs are captured rather than re-emitted, and
    values that are already outputs are not emitted twice. Constant-only values
    (zeros for unused inputs, iotas) are recomputed in the backward.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> joint = jaxaot.partition.trace_joint(lambda x: jnp.sin(x).sum(), jnp.ones(3))
        >>> p = jaxaot.partition.default_partition(joint)
        >>> [(r.source, r.producer) for r in p.residuals]  # sin's derivative, computed in the forward
        [('temporary', 'cos')]
    """
    check_joint(joint, "default_partition")
    return split_joint(joint, forward_values_used_by_backward(joint))


@dataclasses.dataclass(frozen=True)
class Gradient:
    """Forward and backward programs of a function, with their wiring.

    Attributes:
      f: closed jaxpr ``(inputs...) -> (real outputs..., captured temporaries...)``.
      df: closed jaxpr ``(output vjps..., captured inputs..., captured outputs...)
        -> (input vjps...)``.
      f_real_outputs: how many of ``f``'s outputs are the function's outputs.
      df_input_vjps: indices of ``f``'s outputs whose cotangent ``df`` takes
        (outputs of integer dtype take none: their cotangent is a symbolic zero).
      df_input_captured_inputs: indices of ``f``'s inputs that ``df`` captures.
      df_input_captured_outputs: indices of ``f``'s outputs (real or temporary)
        that ``df`` captures.
      df_output_vjps: indices of ``f``'s inputs whose gradients ``df`` returns.
    """

    f: Any
    df: Any
    f_real_outputs: int
    df_input_vjps: tuple[int, ...]
    df_input_captured_inputs: tuple[int, ...]
    df_input_captured_outputs: tuple[int, ...]
    df_output_vjps: tuple[int, ...]


def differentiate(fn: Callable[..., Any], *args: Any) -> Gradient:
    """Split ``fn`` at ``args`` into a forward ``f`` and a backward ``df``.

    Inputs and outputs are the flattened pytrees of ``args`` and of the result.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> x = jnp.arange(3.0)
        >>> g = jaxaot.partition.differentiate(lambda x: jnp.exp(x) * 2, x)
        >>> outs = jax.core.eval_jaxpr(g.f.jaxpr, g.f.consts, x)
        >>> captured = [x for i in g.df_input_captured_inputs] + [outs[i] for i in g.df_input_captured_outputs]
        >>> (dx,) = jax.core.eval_jaxpr(g.df.jaxpr, g.df.consts, jnp.ones(3), *captured)
        >>> bool(jnp.allclose(dx, 2 * jnp.exp(x)))
        True
    """
    if not callable(fn):
        raise InvalidInputError(f"differentiate expects a callable, got {type(fn).__name__}.")
    part = default_partition(trace_joint(fn, *args))
    return Gradient(
        f=part.forward,
        df=part.backward,
        f_real_outputs=part.num_outputs,
        df_input_vjps=part.cotangent_outputs,
        df_input_captured_inputs=part.saved_inputs,
        df_input_captured_outputs=part.saved_outputs,
        df_output_vjps=part.grad_inputs,
    )
