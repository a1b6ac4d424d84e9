"""``aot_module``: compile a Flax module's call ahead of time, writing its state back.

The call becomes ``(static, params, state, *args, **kwargs) -> (out, delta)``,
compiled with ``aot_function``: parameters are the differentiable inputs, the rest
of the state a non-differentiable input (bitcast to unsigned integers when traced,
so it never gets a gradient), and ``delta`` the state the call changed, written
back after each call. :class:`CallMetadata` describes each input and output. This
module checks the options and picks the wrapper (:mod:`jaxaot._src.nn.nnx` or
:mod:`jaxaot._src.nn.linen`).

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(0)))
    >>> aot_model = jaxaot.nn.aot_module(model)
    >>> y = aot_model(jnp.ones((2, 3)))      # batch statistics written back into model
    >>> bool(jnp.all(model.layers[1].mean[...] != 0))
    True
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from flax import linen as nn
from flax import nnx

from jaxaot._src.compile import Compiler
from jaxaot.errors import InvalidInputError
from jaxaot._src.nn.module_call import Method
from jaxaot._src.nn.linen import AOTLinenModule
from jaxaot._src.nn.nnx import AOTModule, wrap_nnx
from jaxaot._src.partition import Partitioner, default_partition


def aot_module(
    module: nnx.Module | nn.Module,
    fw_compiler: Compiler | None = None,
    bw_compiler: Compiler | None = None,
    partition_fn: Partitioner = default_partition,
    *,
    inference_compiler: Compiler | None = None,
    decompositions: Mapping[Any, Callable] | None = None,
    method: Method = "__call__",
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
) -> AOTModule | AOTLinenModule:
    """Compile a Flax module's call ahead of time, writing mutated state back.

    For an ``nnx.Module`` it returns an :class:`AOTModule` (itself an
    ``nnx.Module`` wrapping ``module``) with the module's call signature, whose
    attributes and state are ``module``'s: a model holding it has the state
    paths of the model holding ``module``. For a linen module it returns an
    :class:`AOTLinenModule` (itself a Linen module) whose ``init`` is the
    module's and whose ``apply`` mirrors ``module.apply(variables, ...,
    mutable=[...])``; as a submodule of a plain Linen module it keeps the
    module's variable paths.

    Args:
      module: the ``flax.nnx.Module`` or ``flax.linen.Module``.
      fw_compiler, bw_compiler, partition_fn, inference_compiler, decompositions:
        as in :func:`jaxaot.aot_function`.
      method: nnx only: the method to call (a name, or ``fn(module, *args)``);
        linen takes ``method=`` per ``apply`` call as linen does.
      static_argnums / static_argnames: positions / names of call arguments that
        are compile-time constants (``train=True``, say), as in ``jax.jit``.

    Raises:
      InvalidInputError: ``module`` is not a Flax module, ``method`` does not
        exist, or a static argument is invalid or unhashable; at call time, an
        argument holds an nnx Module or Variable (only the wrapped module's state
        is written back).

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> from flax import nnx
        >>> model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        >>> aot_model = jaxaot.nn.aot_module(model)
        >>> grads = nnx.grad(lambda m: m(jnp.ones((1, 3))).sum())(aot_model)
        >>> grads["kernel"][...].shape
        (3, 2)
    """
    nums = _static_argnums(static_argnums)
    names = _static_argnames(static_argnames)
    aot_kwargs = dict(fw_compiler=fw_compiler, bw_compiler=bw_compiler, partition_fn=partition_fn,
                      inference_compiler=inference_compiler, decompositions=decompositions)
    if isinstance(module, nn.Module):
        return AOTLinenModule.of(module, nums, names, **aot_kwargs)
    if not isinstance(module, nnx.Module):
        raise InvalidInputError(
            f"aot_module expects a flax.nnx.Module or a flax.linen.Module, got {type(module).__name__}. "
            "Use jaxaot.aot_function for plain functions."
        )
    return wrap_nnx(module, method, nums, names, **aot_kwargs)


def _static_argnums(value: Any) -> tuple[int, ...]:
    """``static_argnums`` as ``jax.jit`` takes it (an int, or an iterable of ints, numpy integers included),
    as sorted distinct positions: static arguments are re-inserted in increasing position. Booleans and
    negative positions are refused, as :func:`jaxaot.aot_function` refuses them.

    Example:
        >>> _static_argnums(2), _static_argnums([np.int64(3), 1, 3])
        ((2,), (1, 3))
        >>> _static_argnums(1.5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxaot.errors.InvalidInputError: static_argnums must be an int or a sequence of ints ...
    """
    try:
        nums = (_index(value),)
    except TypeError:
        try:
            nums = tuple(_index(i) for i in value)
        except TypeError:
            raise InvalidInputError(
                f"static_argnums must be an int or a sequence of ints (the positions of the call's arguments that "
                f"are compile-time constants, as jax.jit takes them), got {type(value).__name__} {value!r}. Pass "
                f"static_argnums=1 or static_argnums=(1, 2), or static_argnames='train' to name them.") from None
    negative = [i for i in nums if i < 0]
    if negative:
        raise InvalidInputError(
            f"static_argnums must be non-negative positions, got {value!r}: count the call's arguments from 0 "
            f"(static_argnums=1 for the second), or name them with static_argnames.")
    return tuple(sorted(set(nums)))


def _index(i: Any) -> int:
    """``operator.index(i)`` (what ``jax.jit`` reads a position with), booleans refused."""
    if isinstance(i, (bool, np.bool_)):
        raise TypeError("a bool is not a position")
    return operator.index(i)


def _static_argnames(value: Any) -> tuple[str, ...]:
    """``static_argnames`` as ``jax.jit`` takes it: a str, or an iterable of str.

    Example:
        >>> _static_argnames("train"), _static_argnames(["train", "mode"])
        (('train',), ('train', 'mode'))
    """
    if isinstance(value, str):
        return (value,)
    try:
        names = tuple(value)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise InvalidInputError(
            f"static_argnames must be a str or a sequence of str (the names of the call's keyword arguments that "
            f"are compile-time constants, as jax.jit takes them), got {type(value).__name__} {value!r}. Pass "
            f"static_argnames='train' or static_argnames=('train', 'mode'), or static_argnums for positions.")
    return names
