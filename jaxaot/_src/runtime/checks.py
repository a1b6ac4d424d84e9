"""What ``AOTFunction.backward`` checks before it runs: residuals and cotangents from users.

Residuals must come from this function's own forward, for the same signature
and the same build of its programs, and have the shapes the partition saved.
Cotangents must have the outputs' structure and, for every output that takes
one, its shape and dtype (integer outputs take none and may be ``None``).
"""

from __future__ import annotations

from typing import Any, Sequence

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval, leaf_paths
from jaxaot.errors import CotangentMismatchError, ResidualsMismatchError
from jaxaot._src.runtime.training import TrainingPrograms
from jaxaot._src.runtime.residual_table import ResidualTable
from jaxaot._src.runtime.residuals import Residuals
from jaxaot._src.runtime.shardings import check_residual_shardings
from jaxaot._src.runtime.signature import describe_signature
from jaxaot._src.runtime.vjp import flatten_cotangents, select_cotangents, shape_and_dtype_name

_ArrayImpl = C.ArrayImpl


def check_residuals_origin(name: str, owner: Any, residuals: Any) -> TrainingPrograms:
    """The training programs that made ``residuals``, if they are ``owner``'s current ones."""
    if not isinstance(residuals, Residuals):
        raise ResidualsMismatchError(
            f"backward expects the Residuals returned by {name}.forward, got {type(residuals).__name__}."
        )
    tr = residuals.training
    if tr.options is not owner:
        raise ResidualsMismatchError(
            f"these residuals were produced by another function ({tr.options.name}), not by "
            f"{name}: pass the residuals of this function's own forward."
        )
    if residuals.generation != tr.generation:
        raise ResidualsMismatchError(
            "these residuals were produced before a while loop in the function outgrew its stack "
            "and the programs were rebuilt with a larger one: run forward again."
        )
    return tr


def check_residual_arrays(tr: TrainingPrograms, arrays: Sequence[Any]) -> None:
    """Raise :class:`~jaxaot.errors.ResidualsMismatchError` unless ``arrays`` fit the saved values."""
    expected = tr.partition.residuals
    where = f"signature ({describe_signature(tr.programs.signature)})"
    if len(arrays) != len(expected):
        raise ResidualsMismatchError(f"expected {len(expected)} residuals for {where}, got {len(arrays)}.")
    for i, (x, r) in enumerate(zip(arrays, expected)):
        got, want = shape_and_dtype_name(x), (tuple(r.aval.shape), format_aval(r.aval, short=False))
        if got is None or (got[0], f"{got[1]}{list(got[0])}") != want:
            shown = type(x).__name__ if got is None else f"{got[1]}{list(got[0])}"
            raise ResidualsMismatchError(
                f"residual {i} is {shown} but {where} saved {want[1]}: "
                "pass the residuals produced by forward for the same input signature."
            )
    if tr.programs.sharded:
        labels = [str(row.label) for row in ResidualTable.of(tr.partition, tr.joint)]
        check_residual_shardings(arrays, tr.placement.residuals(), [f"{i} ({label})" for i, label in enumerate(labels)])


def user_cotangents(tr: TrainingPrograms, cotangents: Any) -> list:
    """The cotangents the backward takes, from a pytree shaped like the outputs."""
    out_tree, out_avals, selected = tr.programs.out_tree, tr.out_avals, tr.partition.cotangent_outputs
    if type(cotangents) is _ArrayImpl and out_tree.num_leaves == 1:
        # One array output (a loss): the common case, checked without a flatten.
        aval = out_avals[0]
        if selected == (0,) and cotangents.shape == aval.shape and cotangents.dtype == aval.dtype:
            return [cotangents]
        flat = [cotangents]
    else:
        flat = flatten_cotangents(cotangents, out_tree)

    def check(what: str, i: int, ct: Any) -> None:
        got, want = shape_and_dtype_name(ct), format_aval(out_avals[i], short=False)
        if got is None or f"{got[1]}{list(got[0])}" != want:
            shown = type(ct).__name__ if got is None else f"{got[1]}{list(got[0])}"
            raise CotangentMismatchError(
                f"{what} is {shown}, but the output is {want}: pass a cotangent of the output's shape and dtype."
            )

    return select_cotangents(flat, selected, leaf_paths(out_tree, "output"), check)
