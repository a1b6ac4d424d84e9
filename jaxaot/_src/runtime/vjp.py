"""The wiring between a split pair of programs and JAX's autodiff, shared by every runtime.

:class:`~jaxaot.AOTFunction` and loaded artifacts both hold a forward (outputs and
residuals) and a backward program. :func:`custom_vjp_of` connects such a pair to
``jax.grad``; :func:`scatter` places the differentiated inputs' gradients among the
others; :func:`select_cotangents` checks user cotangents for an explicit
``backward``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import dtype_name
from jaxaot.errors import CotangentMismatchError


@dataclasses.dataclass(frozen=True)
class SplitPrograms:
    """A forward/backward pair as the ``custom_vjp`` rules call it.

    Attributes:
      primal: ``leaves -> outputs``, used only when JAX traces the call.
      forward: ``leaves -> (outputs, residuals)``.
      backward: ``(residuals, selected cotangents) -> grads of grad_inputs``.
      num_inputs: how many input leaves.
      grad_inputs: the input leaves that get a gradient, in the backward's order.
      cotangent_outputs: the output leaves whose cotangent the backward takes.
      cotangent_dtypes: the dtype each of those cotangents must have.
    """

    primal: Callable[[Sequence[Any]], list]
    forward: Callable[[Sequence[Any]], tuple[list, list]]
    backward: Callable[[Sequence[Any], Sequence[Any]], list]
    num_inputs: int
    grad_inputs: tuple[int, ...]
    cotangent_outputs: tuple[int, ...]
    cotangent_dtypes: tuple[Any, ...]


def scatter(positions: Sequence[int], values: Sequence[Any], fill: Sequence[Any]) -> list:
    """``fill`` with ``values[k]`` placed at ``positions[k]``.

    Example:
        >>> scatter([1, 3], ["a", "b"], [None] * 4)
        [None, 'a', None, 'b']
    """
    out = list(fill)
    for i, v in zip(positions, values):
        out[i] = v
    return out


def as_dtype(ct: Any, dtype: Any) -> Any:
    """``ct`` in ``dtype``: ``custom_vjp`` may hand a weak-typed or instantiated-zero cotangent, or a Python scalar
    (kept weakly typed, as JAX's autodiff reads one: the gradients it reaches are weakly typed too)."""
    if getattr(ct, "dtype", None) != dtype:
        weak = type(ct) in (int, float, complex)
        ct = jax.numpy.asarray(ct, dtype)
        if weak:
            ct = C.typed_as(ct, jax.ShapeDtypeStruct(ct.shape, dtype, weak_type=True))
    return ct


def custom_vjp_of(programs: SplitPrograms) -> Callable[..., list]:
    """``f(*leaves) -> outputs`` whose reverse mode runs ``programs.forward``/``backward``."""

    @jax.custom_vjp
    def call(*leaves):
        return programs.primal(leaves)

    def fwd(*leaves):
        return programs.forward(leaves)

    def bwd(residuals, cts):
        selected = [as_dtype(cts[i], d) for i, d in zip(programs.cotangent_outputs, programs.cotangent_dtypes)]
        grads = programs.backward(residuals, selected)
        return tuple(scatter(programs.grad_inputs, grads, [None] * programs.num_inputs))

    call.defvjp(fwd, bwd)
    return call


def flatten_cotangents(cotangents: Any, out_tree: Any) -> list:
    """Cotangent leaves (``None`` allowed for outputs that take none), checked against ``out_tree``."""
    flat, tree = jax.tree_util.tree_flatten(cotangents, is_leaf=lambda x: x is None)
    if tree != out_tree and jax.tree_util.tree_structure(cotangents) != out_tree:
        raise CotangentMismatchError(
            f"cotangents have structure {tree} but the outputs have structure {out_tree}."
        )
    return flat


def select_cotangents(flat: Sequence[Any], cotangent_outputs: Sequence[int], out_paths: Sequence[str],
                      check: Callable[[str, int, Any], None]) -> list:
    """The cotangents the backward takes, each checked by ``check(what, output index, ct)``.

    ``check`` raises :class:`~jaxaot.errors.CotangentMismatchError` for a leaf of the
    wrong shape or dtype; a missing (``None``) cotangent is refused here.
    """
    out = []
    for i in cotangent_outputs:
        ct, what = flat[i], f"cotangent for {out_paths[i]}"
        if ct is None:
            raise CotangentMismatchError(f"{what} is None, but that output takes a cotangent: pass an array of "
                                         "its shape and dtype.")
        check(what, i, ct)
        out.append(ct)
    return out


def shape_and_dtype_name(x: Any) -> tuple[tuple, str] | None:
    """``(shape, dtype name)`` of an array or Python/NumPy scalar, as JAX takes it (a NumPy value's dtype
    canonicalized: float64 is float32 without ``jax_enable_x64``); None for anything else."""
    if isinstance(x, (np.ndarray, np.generic)):
        return tuple(x.shape), dtype_name(jax.dtypes.canonicalize_dtype(x.dtype))
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return tuple(x.shape), dtype_name(x.dtype)
    if isinstance(x, (bool, int, float, complex)) or hasattr(x, "dtype"):
        return (), dtype_name(jax.numpy.result_type(x))
    return None


def read_only_float0s(avals: Sequence[Any]) -> list:
    """float0 zeros per input (the grads of leaves not differentiated), read-only.

    float0 arrays hold no data; read-only, one set can be handed out on every call.
    """
    zeros = [C.zeros_float0(a.shape) for a in avals]
    for z in zeros:
        z.flags.writeable = False
    return zeros
