"""The shardings a signature's programs are compiled for, and the checks that keep them honest.

jaxaot distributes nothing itself: a signature whose inputs are committed to several
devices, or traced under a mesh, is compiled by XLA's SPMD partitioner for those
shardings. The forward takes the inputs' shardings; residuals keep what the compiled
forward gave them (or are replicated), and the backward is compiled for exactly
those, so nothing is resharded; gradients take their parameters' shardings. A
mismatch is a :class:`~jaxaot.errors.ShardingMismatchError` or
:class:`~jaxaot.errors.ResidualsMismatchError` naming the leaf and both shardings.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import leaf_paths_or_positions
from jaxaot.errors import InvalidValueError, ResidualsMismatchError, ShardingMismatchError

#: The residual-sharding policies ``aot_function(residual_sharding=...)`` accepts.
RESIDUAL_SHARDING_POLICIES = ("producer", "replicated")


def context_mesh() -> Any:
    """The mesh of the enclosing ``jax.set_mesh`` context, or None outside one and inside a ``shard_map`` over every
    axis (where each value is one device's: nothing to place). The mesh of devices where one was entered (two
    meshes of one shape on other devices share their abstract mesh, and compile apart, as under ``jit``), else
    the abstract mesh (``use_abstract_mesh``, a ``shard_map`` over some axes)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or C.all_manual(mesh):
        return None
    devices = C.device_context()
    return devices if devices is not None and devices.abstract_mesh == mesh else mesh


def is_abstract(sharding: Any) -> bool:
    """Whether ``sharding`` is on an abstract mesh (inside ``jit``: no devices yet)."""
    return isinstance(getattr(sharding, "mesh", None), jax.sharding.AbstractMesh)


def is_multi_device(sharding: Any) -> bool:
    """Whether ``sharding`` spans more than one device (None and single devices do not)."""
    if sharding is None or C.single_device_of(sharding) is not None:
        return False
    if is_abstract(sharding):
        return sharding.mesh.size > 1
    return len(sharding.device_set) > 1


def default_device() -> Any:
    """The device uncommitted arrays go to, where ``jit`` runs them: ``jax.default_device``'s, else the first."""
    chosen = jax.config.jax_default_device
    if chosen is None:
        return jax.devices()[0]
    return jax.devices(chosen)[0] if isinstance(chosen, str) else chosen


def is_sharded(avals: Sequence[jax.ShapeDtypeStruct], mesh: Any) -> bool:
    """Whether a signature is *placed*: an input is committed to devices other than the default one
    (several devices, or one that is not :func:`default_device`), or a mesh context is set.

    Such signatures compile every program for where their inputs live.
    """
    if mesh is not None:
        return True
    default = default_device()
    for a in avals:
        s = a.sharding
        if s is not None and not C.all_manual(s) and (
                is_multi_device(s) or C.single_device_of(s) not in (None, default)):
            return True
    return False


def check_policy(policy: str) -> str:
    """``policy`` if it is a residual-sharding policy, else a typed error listing them."""
    if policy not in RESIDUAL_SHARDING_POLICIES:
        raise InvalidValueError(
            f"residual_sharding must be one of {RESIDUAL_SHARDING_POLICIES}, got {policy!r}: 'producer' keeps "
            "the sharding the forward gave each residual, 'replicated' copies every residual to every device.")
    return policy


def check_same_devices(treedef: Any, leaves: Sequence[Any], avals: Sequence[jax.ShapeDtypeStruct]) -> None:
    """Raise :class:`~jaxaot.errors.ShardingMismatchError` when committed inputs live on different devices.

    JAX's ``jit`` refuses such a call as well; this names both leaves and both
    shardings, before anything is traced.
    """
    first = None
    for i, a in enumerate(avals):
        if a.sharding is None or is_abstract(a.sharding):
            continue
        devices = a.sharding.device_set
        if first is None:
            first = (i, a.sharding, devices)
        elif devices != first[2]:
            paths = leaf_paths_or_positions(treedef, "input", len(leaves))
            raise ShardingMismatchError(
                f"{paths[first[0]]} is committed to {_describe(first[1])} but {paths[i]} to "
                f"{_describe(a.sharding)}: every input of one call must live on the same devices (one mesh). "
                "Move them with jax.device_put(x, sharding) onto one mesh first.")


def _describe(sharding: Any) -> str:
    ids = sorted(d.id for d in sharding.device_set)
    return f"{sharding} (devices {ids})"


def placed_as_compiled(leaves: Sequence[Any], got: Sequence[tuple], want: Sequence[tuple], paths: Sequence[str],
                       name: str) -> list | None:
    """``leaves`` placed where a compiled stage takes them, as JAX's ``Compiled`` places its arguments.

    ``got`` and ``want``: per leaf, ``(aval, sharding)`` of the call and of the stage (a None sharding: the
    default device). Where only placements differ, an uncommitted leaf (an array made without ``device_put``, a
    NumPy array) is copied to the stage's sharding, as is a committed one whose sharding places it the same way
    (``P('data')`` on a mesh whose ``data`` axis has one device and ``P()``, say); any other committed one is a
    :class:`~jaxaot.errors.ShardingMismatchError` (JAX's ``Compiled`` raises a ``ValueError``). As JAX's, it takes a
    leaf that differs from the stage's only in weak type (a Python scalar for a ``float32`` array, or the
    reverse), typed as the stage's. None where a shape or dtype differs: not this stage's signature.
    """
    if len(got) != len(want) or any(not _same_type(g[0], w[0]) for g, w in zip(got, want)):
        return None
    out = [_weak_typed_as(x, g[0], w[0]) for x, g, w in zip(leaves, got, want)]
    for i, (x, (_, have), (_, sharding)) in enumerate(zip(out, got, want)):
        if have == sharding:
            continue
        if isinstance(x, jax.Array) and x.committed and not (
                sharding is not None and x.sharding.is_equivalent_to(sharding, x.ndim)):
            raise ShardingMismatchError(
                f"{paths[i]} is committed to {_describe(x.sharding)}, but this stage of {name} was compiled for "
                f"{'the default device' if sharding is None else _describe(sharding)}: a compiled stage takes "
                "committed arrays where it was compiled for them (uncommitted ones it copies there), as JAX's do. "
                f"Move it there with jax.device_put, lower and compile for this sharding, or call {name} itself, "
                "which compiles each signature on first use.")
        if sharding is not None:
            out[i] = jax.device_put(x, sharding)
    return out


def _same_type(a: Any, b: Any) -> bool:
    """Whether two avals have one shape and dtype (the weak type, and the mesh a committed array's aval names, left
    out: JAX's ``Compiled`` takes either weak type)."""
    return (tuple(a.shape), a.dtype) == (tuple(b.shape), b.dtype)


def _weak_typed_as(x: Any, have: Any, want: Any) -> Any:
    """``x`` (of aval ``have``) with the weak type of ``want``: an array of the same values either way."""
    weak = bool(getattr(want, "weak_type", False))
    if bool(getattr(have, "weak_type", False)) == weak:
        return x
    if weak:
        return C.typed_as(x, with_sharding(want, None))
    return jax.lax.convert_element_type(x, want.dtype)


def output_shardings(executable: Any) -> list | None:
    """The flat output shardings of a compiled program, or None if its compiler does not say."""
    exe = getattr(executable, "executable", executable)  # a CheckedExecutable wraps the Compiled
    shardings = getattr(exe, "output_shardings", None)
    if shardings is None:
        return None
    return list(jax.tree_util.tree_leaves(shardings, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding)))


def input_shardings(executable: Any) -> list | None:
    """The flat input shardings of a compiled program, or None if its compiler does not say."""
    exe = getattr(executable, "executable", executable)
    shardings = getattr(exe, "input_shardings", None)
    if shardings is None:
        return None
    return list(jax.tree_util.tree_leaves(shardings, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding)))


def mesh_of(avals: Sequence[jax.ShapeDtypeStruct]) -> Any:
    """The ``jax.sharding.Mesh`` of the first input with a ``NamedSharding``, else the context's, else None."""
    for a in avals:
        mesh = getattr(a.sharding, "mesh", None)
        if isinstance(mesh, jax.sharding.Mesh):
            return mesh
    try:
        mesh = jax.sharding.get_mesh()
    except ValueError:  # under jit only the abstract mesh is known
        mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def replicated(mesh: Any) -> Any:
    """A full copy on every device of ``mesh`` (None without a mesh: nothing is pinned)."""
    return None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def with_sharding(aval: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    """``aval`` as a ``ShapeDtypeStruct`` carrying ``sharding``."""
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding, weak_type=getattr(aval, "weak_type", False))


class Copy(NamedTuple):
    """A pin of an output that is a copy of its value: the copy lives at ``sharding``, the value where it is made.

    A residual replicated for the backward is such a copy. A plain pin also places the value itself (XLA's
    sharding propagation carries it back to the value's producers and from there to the function's own outputs,
    which would come back replicated too); an ``optimization_barrier`` between value and copy keeps the pin on
    the copy, so the outputs keep the shardings ``jax.jit`` gives them.
    """

    sharding: Any


def lowering_mesh(out_shardings: Sequence[Any]) -> contextlib.AbstractContextManager:
    """The mesh context a signature's programs lower in: the mesh of an output pinned to ``Explicit`` axes, where no
    mesh is set (its ``reshard`` lowers only in a mesh context; ``jit``'s ``out_shardings`` places the program on
    that mesh likewise); else none."""
    mesh = next((getattr(o, "mesh", None) for o in out_shardings
                 if is_multi_device(o) and C.explicit_axes(getattr(o, "mesh", None))), None)
    if mesh is None or C.device_context() is not None or not hasattr(jax, "set_mesh"):
        return contextlib.nullcontext()
    return jax.set_mesh(mesh)


def constrain_outputs(closed: Any, shardings: Sequence[Any]) -> Any:
    """``closed`` with each output pinned to ``shardings[i]`` (None leaves that output free; a :class:`Copy` pins a
    copy of the output, leaving the value where XLA puts it).

    The pin is a ``with_sharding_constraint`` (``reshard`` for Explicit mesh axes) at the end of the program, so it
    holds for any compiler and under any trace.
    """
    if all(s is None for s in shardings):
        return closed
    in_avals = [C.abstract_input(a) for a in C.in_avals_of(closed)]  # no sharding but shard_map's variance

    def pin(o: Any, s: Any) -> Any:
        if s is None:
            return o
        if isinstance(s, Copy):
            return C.pin_sharding(jax.lax.optimization_barrier(o), s.sharding)
        return C.pin_sharding(o, s)

    def pinned(*args: Any) -> list:
        outs = C.eval_closed(closed, *args)
        return [pin(o, s) for o, s in zip(outs, shardings)]

    return jax.make_jaxpr(pinned)(*in_avals)


def check_residual_shardings(arrays: Sequence[Any], expected: Sequence[Any], labels: Sequence[str]) -> None:
    """Raise :class:`~jaxaot.errors.ResidualsMismatchError` when a residual's sharding is not the compiled one."""
    for x, want, label in zip(arrays, expected, labels):
        got = getattr(x, "sharding", None)
        if want is None or got is None or C.is_tracer(x):
            continue
        if not got.is_equivalent_to(want, x.ndim):
            raise ResidualsMismatchError(
                f"residual {label} has sharding {got}, but the backward was compiled for {want}: pass the "
                "residuals exactly as forward returned them (do not reshard or move them between the two).")


def reshard_cotangents(cts: Sequence[Any], expected: Sequence[Any]) -> list:
    """Cotangents placed where the backward was compiled to take them (a copy only where they differ).

    ``jax.vjp``'s backward accepts a cotangent of any sharding; so does this.
    """
    out = []
    for ct, want in zip(cts, expected):
        got = getattr(ct, "sharding", None)
        if want is not None and got is not None and not C.is_tracer(ct) and not got.is_equivalent_to(want, ct.ndim):
            ct = jax.device_put(ct, want)
        out.append(ct)
    return out
