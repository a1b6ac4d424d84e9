"""Stage 3: compilers turn a closed jaxpr into something callable.

A compiler is ``compiler(closed_jaxpr, example_avals, *, donate_argnums=()) ->
callable`` (the :class:`Compiler` protocol); the callable takes the flat inputs
and returns the flat outputs (a list). ``example_avals`` are
``jax.ShapeDtypeStruct`` (shape, dtype, weak type, sharding) per input.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot import compilers
    >>> closed = jax.make_jaxpr(jnp.sin)(1.0)
    >>> run = compilers.xla(closed, [jax.ShapeDtypeStruct((), jnp.float32)])
    >>> float(run(0.0)[0])
    0.0
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import jax

from jaxaot._src import compat as C


class Compiler(Protocol):
    """What the runtime and the persistent cache call to compile one program.

    The program and its example inputs are passed by position (a compiler names them as it likes);
    ``donate_argnums`` names inputs whose buffers the executable may reuse for
    its outputs; a compiler that cannot donate ignores it.
    """

    def __call__(
        self,
        closed_jaxpr: Any,
        example_avals: Sequence[jax.ShapeDtypeStruct],
        /,
        *,
        donate_argnums: Sequence[int] = (),
    ) -> Callable[..., list]: ...


def as_function(closed_jaxpr: Any) -> Callable[..., list]:
    """A Python function that evaluates ``closed_jaxpr`` (inlines into any trace)."""

    def run(*args):
        return C.eval_closed(closed_jaxpr, *args)

    return run


def xla(closed_jaxpr: Any, example_avals: Sequence[jax.ShapeDtypeStruct], *,
        donate_argnums: Sequence[int] = ()) -> jax.stages.Compiled:
    """Compile ahead of time with XLA: ``jax.jit(...).lower(...).compile()``.

    The result is a ``jax.stages.Compiled``: it has ``memory_analysis()`` and
    ``cost_analysis()``, and refuses inputs of another shape or dtype.
    """
    return lower_xla(closed_jaxpr, example_avals, donate_argnums=donate_argnums).compile()


def lower_xla(closed_jaxpr: Any, example_avals: Sequence[jax.ShapeDtypeStruct], *,
              donate_argnums: Sequence[int] = ()) -> jax.stages.Lowered:
    """:func:`xla`'s program lowered, not yet compiled. Lowering reads the calling thread's JAX configuration
    (x64, matmul precision, the mesh in context); ``compile()`` of the result reads none, so it may run on a
    worker thread (:mod:`jaxaot._src.workers`)."""
    jitted = jax.jit(as_function(closed_jaxpr), donate_argnums=tuple(donate_argnums), keep_unused=True)
    return jitted.lower(*example_avals)


def nop(closed_jaxpr: Any, example_avals: Sequence[jax.ShapeDtypeStruct], *,
        donate_argnums: Sequence[int] = ()) -> Callable[..., list]:
    """Evaluate the jaxpr eqn by eqn, without compiling it (for debugging); donates nothing."""
    del example_avals, donate_argnums
    return as_function(closed_jaxpr)


def print_jaxpr(closed_jaxpr: Any, example_avals: Sequence[jax.ShapeDtypeStruct], *,
                donate_argnums: Sequence[int] = ()) -> jax.stages.Compiled:
    """Print the program, then compile it with :func:`xla`. Run for its print, it is never served from the
    persistent cache (:data:`RUN_EACH_COMPILE`): each process that compiles the program prints it."""
    print(closed_jaxpr)
    return xla(closed_jaxpr, example_avals, donate_argnums=donate_argnums)


#: Compilers run for what they do besides compiling, whose executables the persistent cache never stores.
RUN_EACH_COMPILE = frozenset({print_jaxpr})
