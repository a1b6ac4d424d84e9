"""A pipeline's batch as microbatches, and the check that its stages fit together.

:func:`split` splits the leaves of ``inputs`` and ``targets`` along axis 0 on their
own device; :func:`stage_input_specs` runs the stages' shapes through the chain
with ``jax.eval_shape`` before anything compiles, so a stage that does not fit the
next raises :class:`~jaxaot.errors.StageMismatchError` naming both.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src.pytrees import format_aval, leaf_paths
from jaxaot.errors import InvalidValueError, StageMismatchError

#: What ``jax.eval_shape`` raises for arguments a function cannot take.
_TRACE_ERRORS = (TypeError, ValueError, IndexError)


def describe(tree: Any) -> str:
    """``f32[4,16]`` for one array, the pytree of such strings otherwise."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    texts = [format_aval(x) for x in leaves]
    if treedef.num_nodes == 1 and len(texts) == 1:
        return texts[0]
    return str(jax.tree_util.tree_unflatten(treedef, texts)).replace("'", "")


def leaf_type(x: Any) -> jax.ShapeDtypeStruct:
    """``x``'s shape, dtype and weak type, as JAX traces it (a Python float: a weakly typed float32)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type)
    a = jax.typeof(x)
    return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)


def check_batch(name: str, tree: Any, num_microbatches: int) -> None:
    """Raise :class:`~jaxaot.errors.InvalidValueError` unless every leaf of ``tree`` splits in ``num_microbatches``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        raise InvalidValueError(f"the pipeline's {name} hold no arrays: they must be split into microbatches.")
    for path, x in zip(leaf_paths(treedef, name), leaves):
        shape = jnp.shape(x)
        if not shape:
            raise InvalidValueError(
                f"{path} is a scalar: each leaf of the pipeline's {name} needs a leading batch axis to split into "
                f"num_microbatches={num_microbatches} microbatches (close the step's function over a value shared "
                "by every microbatch).")
        if shape[0] % num_microbatches:
            raise InvalidValueError(
                f"{path} has shape {tuple(shape)}, whose axis 0 does not split into num_microbatches="
                f"{num_microbatches} equal microbatches: make the batch a multiple of {num_microbatches}.")


@functools.partial(jax.jit, static_argnums=1)
def _split(tree: Any, num_microbatches: int) -> list:
    def part(x: jax.Array, i: int) -> jax.Array:
        return x.reshape(num_microbatches, x.shape[0] // num_microbatches, *x.shape[1:])[i]

    return [jax.tree_util.tree_map(functools.partial(part, i=i), tree) for i in range(num_microbatches)]


def split(tree: Any, num_microbatches: int) -> list:
    """``tree`` as ``num_microbatches`` trees, each leaf cut along axis 0 (on the leaves' device)."""
    if num_microbatches == 1:
        return [tree]
    return _split(tree, num_microbatches)


def stage_input_specs(stage_fns: Sequence[Callable], loss_fn: Callable, params: Sequence[Any],
                      inputs: Any, targets: Any) -> list:
    """Per stage, the shapes of the activations it takes (stage 0: ``inputs``), checked end to end.

    Args:
      stage_fns: the stage functions; params: one parameter tree per stage.
      inputs / targets: one microbatch (arrays or ``jax.ShapeDtypeStruct``).

    Raises:
      StageMismatchError: a stage does not take what the previous one returns,
        the first stage does not take the inputs, ``loss_fn`` does not take the
        last stage's output and the targets, or the loss is not a float scalar.
    """
    specs = [jax.tree_util.tree_map(leaf_type, inputs)]
    for s, fn in enumerate(stage_fns):
        try:
            out = jax.eval_shape(fn, params[s], specs[s])
        except _TRACE_ERRORS as e:
            if not _raised_by_jax(e):
                raise  # the stage's own error (a check of its input), as the stage raised it
            raise _mismatch(stage_fns, params, specs, s, e) from e
        specs.append(out)
    last = len(stage_fns) - 1
    try:
        loss = jax.eval_shape(loss_fn, specs[-1], targets)
    except _TRACE_ERRORS as e:
        if not _raised_by_jax(e):
            raise
        raise StageMismatchError(
            f"stage {last} (the last) returns {describe(specs[-1])}, which loss_fn does not take with targets "
            f"{describe(targets)} (one microbatch): {_first_line(e)}") from e
    leaves = jax.tree_util.tree_leaves(loss)
    if len(leaves) != 1 or leaves[0].shape != () or not jnp.issubdtype(leaves[0].dtype, jnp.floating):
        raise StageMismatchError(
            f"loss_fn returns {describe(loss)} on stage {last}'s output: it must return one float scalar, "
            "the loss of one microbatch.")
    return specs[:-1]


def _mismatch(stage_fns: Sequence[Callable], params: Sequence[Any], specs: list, s: int,
              error: Exception) -> StageMismatchError:
    if s == 0:
        return StageMismatchError(
            f"stage 0 does not take the pipeline's inputs {describe(specs[0])} (one microbatch): {_first_line(error)}")
    hint = ""
    if jax.tree_util.tree_structure(specs[s - 1]) == jax.tree_util.tree_structure(specs[s]):
        try:  # a common design: stages that keep their input's shape
            jax.eval_shape(stage_fns[s], params[s], specs[s - 1])
            hint = f"; stage {s} does take {describe(specs[s - 1])}, what stage {s - 1} takes"
        except _TRACE_ERRORS:
            pass
    return StageMismatchError(
        f"stage {s - 1} returns {describe(specs[s])}, which stage {s} does not take as its input "
        f"({_first_line(error)}){hint}.")


_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, np))


def _raised_by_jax(error: Exception) -> bool:
    """Whether JAX (or NumPy) raised ``error`` where it was raised (a shape that an operation refuses), not the
    user's code (a stage checking its input and raising its own error, which goes up as it is). JAX's errors of a
    traced value used as a Python one (``if x > 0``, ``float(x)``) are the stage's own, as JAX raised them."""
    if isinstance(error, getattr(jax.errors, "JAXTypeError", ())):
        return False
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is None or tb.tb_frame.f_code.co_filename.startswith(_LIBRARIES)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0].rstrip(".") if text else type(error).__name__
