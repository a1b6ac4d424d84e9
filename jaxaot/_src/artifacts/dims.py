"""Symbolic dimensions written as expressions (``2*a``, ``floordiv(b, 2)``, ``a^2``): their values for a call's shapes.

A loaded artifact binds its plain dimension variables from the arrays it is
called with; :func:`check_compound_dims` checks the dims that are expressions
against those values, and :func:`check_constraints` the constraints the dims were
exported with (``b >= 4``), so a call that does not fit is an error naming the
argument before ``jax.export`` sees it.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any, Callable, Mapping, Sequence

from jaxaot._src.runtime import shape_and_dtype_name

_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Pow: operator.pow,
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
        return _value(_parse(expr), env)
    except (SyntaxError, KeyError, ValueError, TypeError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _parse(expr: str) -> ast.AST:
    """``expr`` as a Python expression; ``jax.export`` writes a power as ``a^2``. Large exponents are refused."""
    tree = ast.parse(expr.replace("^", "**"), mode="eval").body
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and not (
            isinstance(n.right, ast.Constant) and type(n.right.value) is int and 0 <= n.right.value <= 64)
           for n in ast.walk(tree)):
        raise ValueError(f"not a dimension expression: {expr[:80]}")
    return tree


def _names(expr: str) -> set[str]:
    """The dimension variables ``expr`` names."""
    try:
        return {n.id for n in ast.walk(_parse(expr)) if isinstance(n, ast.Name)} - set(_FUNCS)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
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


_COMPARISON = re.compile(r"^(.*?)(>=|<=|==)(.*)$")
_HOLDS = {">=": operator.ge, "<=": operator.le, "==": operator.eq}


def check_constraints(constraints: Sequence[str], bound: Mapping[str, tuple[int, str]], error: type[Exception]) -> None:
    """Raise ``error`` unless each of ``constraints`` (``"b >= 4"``) holds for the dimension variables ``bound``
    (``name -> (size, path)``); one naming a variable not bound is left to ``jax.export``."""
    env = {k: v for k, (v, _) in bound.items()}
    for text in constraints:
        match = _COMPARISON.match(text)
        if match is None:
            continue
        left, op, right = (dim_value(match[1].strip(), env), match[2], dim_value(match[3].strip(), env))
        if left is not None and right is not None and not _HOLDS[op](left, right):
            named = (_names(match[1]) | _names(match[3])) & set(bound)
            where = ", ".join(f"{k}={bound[k][0]} in {bound[k][1]}" for k in sorted(named))
            raise error(f"the arguments' sizes break the constraint '{text}' the artifact was exported with "
                        f"({where}).")
