"""A Flax module that is another module's attributes, state and graph, plus hidden static data.

:class:`ProxyModule` is how an :class:`~jaxaot._src.nn.nnx.AOTModule` mixes with
plain Flax state: attribute access, Flax's graph-node protocol and the pytree all
forward to the wrapped module, so ``nnx.state``, ``nnx.split``, ``nnx.Optimizer``
and checkpoints see the wrapped module's paths. The hidden ``extra`` (compiled
programs, say) rides in the node's metadata, never in the state. A model holding
both the wrapped module and its proxy sees their Variables twice.

Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> proxy = ProxyModule(lin, "extra data")
    >>> proxy.kernel is lin.kernel
    True
    >>> sorted(nnx.to_flat_state(nnx.state(proxy)).paths) == sorted(nnx.to_flat_state(nnx.state(lin)).paths)
    True
    >>> merged = nnx.merge(*nnx.split(proxy))
    >>> type(merged).__name__, merged.proxy_extra, type(merged.proxy_target).__name__
    ('ProxyModule', 'extra data', 'Linear')
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from flax import nnx

#: The proxy's own attributes: the wrapped module, the hidden data, Flax's bookkeeping, and caches
#: (``_jaxaot_split``, :mod:`jaxaot._src.nn.split_cache`) that pickling leaves out.
_OWN = frozenset({"_jaxaot_inner", "_jaxaot_extra", "_pytree__nodes", "_jaxaot_split"})
_PICKLED = ("_pytree__nodes", "_jaxaot_inner", "_jaxaot_extra")
#: Dunder attributes Flax sets on modules and reads back, which the wrapped module holds: ``nnx.capture``'s.
_FORWARDED = frozenset({"__captures__"})


class ProxyModule(nnx.Module):
    """``module``'s attributes, Flax graph and pytree, with ``extra`` (hashable) in the node's static part."""

    def __init__(self, module: nnx.Module, extra: Any):
        if not isinstance(module, nnx.Module):
            raise TypeError(f"ProxyModule wraps an nnx.Module, got {type(module).__name__}.")
        object.__setattr__(self, "_jaxaot_inner", module)
        object.__setattr__(self, "_jaxaot_extra", extra)

    @classmethod
    def _wrap(cls, module: Any, extra: Any) -> "ProxyModule":
        """A proxy built without ``__init__`` (as Flax rebuilds nodes): around a possibly empty module."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "_pytree__nodes", cls._pytree__nodes)
        object.__setattr__(obj, "_jaxaot_inner", module)
        object.__setattr__(obj, "_jaxaot_extra", extra)
        return obj

    @property
    def proxy_target(self) -> nnx.Module:
        """The wrapped module."""
        return self._jaxaot_inner

    @property
    def proxy_extra(self) -> Any:
        """The hidden static data."""
        return self._jaxaot_extra

    # ------------------------------------------------------------------ Python attributes
    @property
    def _pytree__state(self) -> Any:  # Flax's trace-level bookkeeping: the wrapped module's
        return self._jaxaot_inner._pytree__state

    @_pytree__state.setter
    def _pytree__state(self, value: Any) -> None:  # set by Flax's constructor; the wrapped module's stands
        pass

    def __getattr__(self, name: str) -> Any:  # only for names the proxy itself lacks
        if name.startswith("_jaxaot_") or (name.startswith("__") and name not in _FORWARDED):
            raise AttributeError(name)
        try:
            inner = object.__getattribute__(self, "_jaxaot_inner")
        except AttributeError:  # being unpickled or rebuilt: nothing to forward to yet
            raise AttributeError(name) from None
        return getattr(inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._jaxaot_inner, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._jaxaot_inner, name)

    def __getstate__(self) -> dict:  # pickle: the wrapped module and the hidden data, no caches
        own = vars(self)
        return {k: own[k] for k in _PICKLED if k in own}

    def __dir__(self) -> Iterable[str]:
        return sorted(set(super().__dir__()) | set(dir(self._jaxaot_inner)))

    # ------------------------------------------------------------------ Flax graph node
    def _graph_node_flatten(self):
        inner = self._jaxaot_inner
        nodes, meta = inner._graph_node_flatten()
        return nodes, (type(self), self._jaxaot_extra, type(inner), meta)

    def _graph_node_set_key(self, key: Any, value: Any) -> None:
        self._jaxaot_inner._graph_node_set_key(key, value)

    def _graph_node_pop_key(self, key: Any) -> Any:
        return self._jaxaot_inner._graph_node_pop_key(key)

    @staticmethod
    def _graph_node_create_empty(meta: tuple) -> "ProxyModule":
        cls, extra, inner_type, inner_meta = meta
        return cls._wrap(inner_type._graph_node_create_empty(inner_meta), extra)

    def _graph_node_clear(self) -> None:
        self._jaxaot_inner._graph_node_clear()

    def _graph_node_init(self, attributes: Iterable[tuple[Any, Any]]) -> None:
        self._jaxaot_inner._graph_node_init(attributes)

    # ------------------------------------------------------------------ JAX pytree
    def _pytree__flatten_with_paths(self):
        inner = self._jaxaot_inner
        children, aux = inner._pytree__flatten_with_paths()
        return children, (self._jaxaot_extra, type(inner), aux)

    def _pytree__flatten(self):
        inner = self._jaxaot_inner
        children, aux = inner._pytree__flatten()
        return children, (self._jaxaot_extra, type(inner), aux)

    @classmethod
    def _pytree__unflatten(cls, static: tuple, children: Iterable[Any]) -> "ProxyModule":
        extra, inner_type, aux = static
        return cls._wrap(inner_type._pytree__unflatten(aux, children), extra)

    # ------------------------------------------------------------------ display
    def _proxy_label(self) -> str:
        return f"{type(self).__name__}[{type(self._jaxaot_inner).__name__}]"

    def __nnx_repr__(self):
        items = iter(self._jaxaot_inner.__nnx_repr__())
        first = next(items)
        yield dataclasses.replace(first, type=self._proxy_label()) if dataclasses.is_dataclass(first) else first
        yield from items

    def __treescope_repr__(self, path: Any, subtree_renderer: Any) -> Any:
        return self._jaxaot_inner.__treescope_repr__(path, subtree_renderer)


__all__ = ["ProxyModule"]
