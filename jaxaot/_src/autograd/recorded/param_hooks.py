"""Post-accumulate hooks: ``fn(param, grad) -> grad`` on each parameter's total gradient.

PyTorch's ``register_post_accumulate_grad_hook`` in JAX terms: a function of a
differentiated leaf's complete gradient, traced into the compiled backward (for
clipping, noise, or an update done inside the backward). ``param_hooks`` maps a
path pattern (``fnmatch`` on ``"layers/0/w"``; one matching nothing is an error)
or a predicate on the path to a hook; every matching hook runs, in order.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Mapping, Sequence

import jax

from jaxaot._src.autograd.recorded.hooks import check_like, hook_name
from jaxaot.errors import InvalidInputError

ParamHook = Callable[[Any, Any], Any]


def check_param_hooks(param_hooks: Any) -> tuple[tuple[Any, ParamHook], ...]:
    """``param_hooks`` as ``((pattern or predicate, fn), ...)``, each part checked."""
    if param_hooks is None:
        return ()
    if not isinstance(param_hooks, Mapping):
        raise InvalidInputError(f"param_hooks must be a dict {{path or predicate: fn(param, grad) -> grad}}, "
                                f"got a {type(param_hooks).__name__}.")
    out = []
    for key, fn in param_hooks.items():
        if not (isinstance(key, str) or callable(key)):
            raise InvalidInputError(f"param_hooks key {key!r} is a {type(key).__name__}: use a path pattern "
                                    "(str, like 'layers/0/w' or '*/kernel') or a predicate path -> bool.")
        if not callable(fn):
            raise InvalidInputError(f"param_hooks[{key!r}] must be callable fn(param, grad) -> grad, "
                                    f"got a {type(fn).__name__}.")
        out.append((key, fn))
    return tuple(out)


def _key_text(k: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def leaf_path_texts(tree: Any, prefix_positions: bool) -> list[str]:
    """``a/b/0`` paths of ``tree``'s leaves (the first key dropped unless ``prefix_positions``)."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    return ["/".join(_key_text(k) for k in (p if prefix_positions else p[1:])) for p in paths]


def _matches(key: Any, path: str) -> bool:
    short = path[: -len("/value")] if path.endswith("/value") else path
    if isinstance(key, str):
        return fnmatch.fnmatchcase(path, key) or fnmatch.fnmatchcase(short, key)
    return bool(key(short))


def plan(hooks: Sequence[tuple[Any, ParamHook]], paths: Sequence[str]) -> tuple[tuple[int, tuple[ParamHook, ...]], ...]:
    """``((leaf index, hooks), ...)`` for the leaves some hook applies to."""
    out = []
    for i, path in enumerate(paths):
        fns = tuple(fn for key, fn in hooks if _matches(key, path))
        if fns:
            out.append((i, fns))
    for key, _ in hooks:
        if isinstance(key, str) and not any(_matches(key, p) for p in paths):
            shown = ", ".join(repr(p) for p in paths[:12]) + (", ..." if len(paths) > 12 else "")
            raise InvalidInputError(f"param_hooks pattern {key!r} matches no differentiated parameter; "
                                    f"the paths are: {shown}.")
    return tuple(out)


def apply(planned: Sequence[tuple[int, tuple[ParamHook, ...]]], params: Sequence[Any], grads: Sequence[Any]) -> list:
    """``grads`` (flat) with each planned leaf's hooks applied in order (inside the traced backward)."""
    grads = list(grads)
    for i, fns in planned:
        for fn in fns:
            new = fn(params[i], grads[i])
            check_like(grads[i], new, f"param hook {hook_name(fn)}")
            grads[i] = new
    return grads
