"""What a module call changed in its module's graph, besides Variable values: refused with a typed error.

:func:`~jaxaot._src.nn.pure.nnx_pure` runs the module's Python on a copy merged in the trace and carries back
the values of its Variables. An attribute the call assigns (``self.calls += 1``, ``self.last = self.l``), a
submodule it builds, a Python list it appends to: none is a Variable value, and nnx.jit or eager Flax would keep
them. :func:`layout` records what sits at each attribute path of the graph, before and after the call, and
:func:`check_unchanged` raises :class:`~jaxaot.errors.InvalidInputError` naming the paths that differ, rather
than let them drop. A Variable the call adds at a new path (``sow``) is state the write-back carries, and a
Variable replaced by a new one of the same type at the same path is a new value: neither counts.

Example:
    >>> from flax import nnx
    >>> lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> before = layout(lin)
    >>> lin.use_bias, lin.extra = False, nnx.Linear(3, 3, rngs=nnx.Rngs(0))
    >>> changes(before, layout(lin))
    ['`use_bias`: True → False', '`extra` is new (Linear)']
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError
from jaxaot._src.nn.proxy import ProxyModule
from jaxaot._src.nn.python_values import _short, same_value


def _items(node: Any) -> list[tuple[Any, Any]]:
    if isinstance(node, nnx.Pytree):
        return [(k, v) for k, v in vars(node).items() if not str(k).startswith("_pytree__")]
    return list(node.items()) if isinstance(node, dict) else list(enumerate(node))


def layout(root: Any) -> dict[str, tuple]:
    """What sits at each attribute path of ``root``'s graph: ``("node", type)``, ``("variable", type)``,
    ``("alias", first path, type)`` for an object met before, ``("array",)``, or ``("value", python value)``."""
    out: dict[str, tuple] = {}
    seen: dict[int, str] = {}

    def visit(node: Any, path: str) -> None:
        if isinstance(node, (jax.Array, np.ndarray)) or C.is_tracer(node):
            out[path] = ("array",)
            return
        if not isinstance(node, (nnx.Variable, nnx.Pytree, list, dict, tuple)):
            out[path] = ("value", node)
            return
        if id(node) in seen:
            out[path] = ("alias", seen[id(node)], type(node))
            return
        if not isinstance(node, tuple):
            seen[id(node)] = path
        if isinstance(node, ProxyModule):  # its own attributes are its programs and caches: the wrapped module's
            node = node.proxy_target
            seen[id(node)] = path
        if isinstance(node, nnx.Variable):
            out[path] = ("variable", type(node))
            return
        out[path] = ("node", type(node))
        named = isinstance(node, nnx.Pytree)
        for key, value in sorted(_items(node), key=lambda kv: str(kv[0])):
            sub = f"{path}.{key}" if named and path else str(key) if named else f"{path}[{key!r}]"
            visit(value, sub)

    visit(root, "")
    out.pop("", None)
    return out


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and (same_value(a[1], b[1]) if a[0] == "value" else a == b)


def _what(entry: tuple) -> str:
    kind = entry[0]
    if kind == "value":
        return _short(entry[1])
    if kind == "alias":
        return f"the {entry[2].__name__} at `{entry[1]}`"
    return "an array" if kind == "array" else entry[1].__name__


def _under(path: str, top: str) -> bool:
    return path.startswith(top) and path[len(top):len(top) + 1] in (".", "[")


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """The paths whose content differs between two :func:`layout`\\ s, in words (the paths inside one are left
    out); a new Variable is not one."""
    found = [(p, f"`{p}`: {_what(before[p])} → {_what(e)}") for p, e in after.items() if p in before
             and not _same(before[p], e)]
    found += [(p, f"`{p}` is new ({_what(e)})") for p, e in after.items() if p not in before and e[0] != "variable"]
    found += [(p, f"`{p}` is gone") for p in before if p not in after]
    tops = [p for p, _ in found]
    return [text for p, text in found if not any(_under(p, top) for top in tops)]


def check_unchanged(module: Any, before: dict[str, tuple], limit: int = 4, loss: str | None = None,
                    writer: str = "aot_module") -> None:
    """Raise :class:`~jaxaot.errors.InvalidInputError` where the call changed ``module``'s graph beyond the
    Variables the write-back carries (``before`` is its :func:`layout` before the call; ``loss``: the name of the
    loss function that ran on it, where one did; ``writer``: the function that writes the Variables back)."""
    found = changes(before, layout(module))
    if not found:
        return
    shown = "; ".join(found[:limit]) + (f"; {len(found) - limit} more" if len(found) > limit else "")
    who = f"the call of {type(module).__name__}" if loss is None else f"the loss function {loss}"
    mode = "" if loss is None else (" A mode the loss switches (m.train(), m.eval()) is such a change: switch it "
                                    "before the gradient's call.")
    raise InvalidInputError(
        f"{who} changed the module's attributes ({shown}). {writer} writes back "
        "only the values of the module's nnx.Variables (and the Variables it sows), so these changes would be "
        "lost. Keep state the call changes in nnx.Variable attributes (self.count[...] += 1), build submodules "
        f"and Variables in __init__, or run this module with nnx.jit.{mode} The module is left as it was."
    )


__all__ = ["changes", "check_unchanged", "layout"]
