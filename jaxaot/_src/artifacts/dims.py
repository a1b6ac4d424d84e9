"""Symbolic dimensions written as expressions (``2*a``, ``floordiv(b, 2)``): their values for a call's shapes.

A loaded artifact binds its plain dimension variables from the arrays it is
called with; :func:`check_compound_dims` checks the dims that are expressions
against those values, so a call that does not fit is an error naming the
argument before ``jax.export`` sees it.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Mapping, Sequence

from jaxaot._src.runtime import shape_and_dtype_name

_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_FUNCS: dict[str, Callable[..., int]] = {
    "max": max, "min": min, "floordiv": operator.floordiv, "mod": operator.mod, "non_negative": lambda a: max(a, 0),
}


def _value(node: ast.AST, env: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]  # KeyError: unbound
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, env)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left, env), _value(node.right, env))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        return _FUNCS[node.func.id](*(_value(a, env) for a in node.args))
    raise ValueError(f"not a dimension expression: {ast.dump(node)[:80]}")


def dim_value(expr: str, env: Mapping[str, int]) -> int | None:
    """The value of the symbolic dim ``expr`` for the variables in ``env``; None when a variable is unbound or
    ``expr`` is not an expression of jax.export's dims."""
    try:
        return _value(ast.parse(expr, mode="eval").body, env)
    except (SyntaxError, KeyError, ValueError, TypeError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _names(expr: str) -> set[str]:
    """The dimension variables ``expr`` names."""
    try:
        return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)} - set(_FUNCS)
    except (SyntaxError, RecursionError, MemoryError):
        return set()


def _solve(expr: str, name: str, have: int, env: Mapping[str, int]) -> int | None:
    """The ``name`` for which ``expr`` is ``have``, where ``expr`` is linear in it (None otherwise)."""
    at = [dim_value(expr, {**env, name: v}) for v in (0, 1, 2)]
    if None in at or at[2] - at[1] != at[1] - at[0] or at[1] == at[0]:
        return None
    slope = at[1] - at[0]
    return (have - at[0]) // slope if (have - at[0]) % slope == 0 else None


def check_compound_dims(paths: Sequence[str], specs: Sequence[Any], xs: Sequence[Any], bound: dict,
                        error: type[Exception]) -> None:
    """Raise ``error`` unless every dim of ``specs`` that is an expression has its value for the variables
    ``bound`` (``name -> (size, path)``, from the plain dims) in ``xs``. A variable no plain dim binds is
    solved from a linear dim of it alone (``2*a``), as ``jax.export`` solves it."""
    dims = []
    for path, spec, x in zip(paths, specs, xs):
        got = shape_and_dtype_name(x)
        if got is not None and len(got[0]) == len(spec.shape):
            dims += [(path, spec, got, want, have) for want, have in zip(spec.shape, got[0])
                     if isinstance(want, str) and not want.isidentifier()]
    for path, spec, (shape, dtype), want, have in dims:
        env = {k: v for k, (v, _) in bound.items()}
        free = _names(want) - set(env)
        if len(free) == 1:
            (name,) = free
            value = _solve(want, name, have, env)
            if value is not None and value >= 1:
                bound[name] = (value, path)
                continue
            if value is not None or dim_value(want, {**env, name: 1}) is not None:
                raise error(f"{path}: dimension '{want}' is {have} here, and no integer {name} >= 1 gives that "
                            f"(expected {spec}, got {dtype}[{','.join(map(str, shape))}]).")
        value = dim_value(want, env)
        if value is not None and value != have:
            where = ", ".join(f"{k}={bound[k][0]} in {bound[k][1]}" for k in sorted(_names(want) & set(bound)))
            raise error(f"{path}: dimension '{want}' is {have} here, but {value} for {where} "
                        f"(expected {spec}, got {dtype}[{','.join(map(str, shape))}]).")
