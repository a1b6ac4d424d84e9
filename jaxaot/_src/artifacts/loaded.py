"""Load an artifact and run it without the source: ``load`` and ``LoadedAOT``.

A :class:`LoadedAOT` checks its inputs against the signature (symbolic dims
bind consistently across leaves), runs the exported programs, turns the
hoisted loop-overflow flags back into :class:`~jaxaot.errors.LoopOverflowError`,
and reaches JAX's autodiff through the same ``custom_vjp`` wiring as
:class:`~jaxaot.AOTFunction` (:mod:`jaxaot._src.runtime.vjp`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Collection, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.artifacts import audit, manifest, signing
from jaxaot._src.artifacts.exported import ExportedAOT
from jaxaot._src.artifacts.export_options import check_load_options
from jaxaot._src.artifacts.program_calls import differentiable_call
from jaxaot._src.artifacts.dims import check_compound_dims, check_constraints
from jaxaot._src.artifacts.mesh_spec import check_call_devices, check_call_platform, check_enough_devices
from jaxaot._src.artifacts.aot_signature import AOTSignature, ArraySpec, RuntimeCheck
from jaxaot._src.artifacts.call_log import CallLog, shapes_of
from jaxaot._src.artifacts.treedef_json import treedef_to_json
from jaxaot._src.artifacts.weak_types import WeakTyping, weak_input_note
from jaxaot.errors import (
    ArtifactError,
    ArtifactInputError,
    ArtifactJvpError,
    ArtifactVmapError,
    CotangentMismatchError,
    LoopOverflowError,
    NotExportableError,
    ResidualsMismatchError,
)
from jaxaot._src.loops import checked_values
from jaxaot._src.runtime import (
    CacheInfo, SplitPrograms, custom_vjp_of, scatter, select_cotangents, shape_and_dtype_name,
)


def load(path: str | Path | ExportedAOT, *, check_versions: bool = True, allow_callbacks: bool = False,
         max_bytes: int | None = None, allow_custom_calls: Collection[str] | None = None,
         key: bytes | None = None) -> "LoadedAOT":
    """Load a directory written by :meth:`jaxaot.export.ExportedAOT.save` (or wrap an ``ExportedAOT``).

    Needs neither the original function nor its module. An artifact exported
    from sharded inputs needs as many devices as its mesh has (``f.mesh()``
    builds that mesh here, ``f.in_shardings(mesh)`` says where each input goes).

    Loading reads JSON and ``jax.export`` flatbuffers only, every file a
    regular file inside the directory, and audits the programs op by op before
    they can run: no host callbacks, every custom call of a target ``jax.export``
    produces and of the types its kernel reads and writes, each program's own
    input and output types and structure equal to what the manifest's signature
    says, a call of each lowering as its own metadata describes it (its entry function there, taking the
    values it says), and exported for a platform this process has (``docs/security.md``,
    "What loading an artifact checks"). Without ``key`` it trusts the
    artifact's source for what the programs compute; with it, anything changed
    in the artifact is refused.

    Args:
      path: the artifact directory, or an in-memory ``ExportedAOT``.
      check_versions: check the jax and jaxlib versions that wrote it (the
        format and jaxaot major version are always checked).
      allow_callbacks: load programs that call host callbacks. A callback
        calls whatever this process registered under its index: pass True
        only for an artifact you built yourself.
      max_bytes: the largest program file to read (default 4 GiB); the manifest
        is read up to the smaller of this and 64 MiB.
      allow_custom_calls: custom-call targets to load without a type rule
        (Pallas kernels: ``("tpu_custom_call",)``), only for an artifact you
        built yourself: their kernels touch whatever memory they are told to.
      key: the secret the artifact was saved with (``save(path, key=...)``):
        its manifest and programs must be exactly what was signed.

    Raises:
      ArtifactError: nothing exists at ``path``, or it is not a folder; missing, unreadable, oversized or
        corrupt files (size or checksum mismatch, a FIFO or a symlink out of the directory), a
        malformed manifest (the message names the field), programs with host
        callbacks, with custom calls that break their type rule (the message
        names the target and the mismatch) or that do not fit the signature,
        programs whose StableHLO a call cannot lower as their metadata says (damaged or altered),
        programs exported for platforms this process does not have (naming
        both), an unsigned or altered artifact when ``key`` is given; a sharded
        artifact and a process with fewer devices than it was exported for.
      ArtifactVersionError: a manifest from an incompatible format, jaxaot, jax or jaxlib.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot, tempfile
        >>> d = jaxaot.export.export(lambda x: jnp.sin(x).sum(), jnp.ones(3)).save(tempfile.mkdtemp())
        >>> f = jaxaot.export.load(d)
        >>> round(float(jax.grad(f)(jnp.zeros(3))[0]), 3)
        1.0
    """
    if isinstance(path, ExportedAOT):
        return LoadedAOT(path)
    allowed = check_load_options(path, check_versions=check_versions, allow_callbacks=allow_callbacks,
                                 max_bytes=max_bytes, allow_custom_calls=allow_custom_calls)
    key = signing.check_key("load", key)
    root = Path(path)
    return manifest.retry_if_replaced(root, lambda: _load_folder(root, check_versions, allow_callbacks, max_bytes,
                                                                 allowed, key))


def _load_folder(root: Path, check_versions: bool, allow_callbacks: bool, max_bytes: int | None,
                 allowed: Collection[str], key: bytes | None) -> "LoadedAOT":
    """:func:`load` of the folder ``root``, its options checked."""
    if not os.path.lexists(root):
        raise ArtifactError(f"load: no artifact at {root}: nothing exists there. Pass the folder that "
                            "jaxaot.export.ExportedAOT.save wrote (the one holding manifest.json).")
    if not root.is_dir():
        raise ArtifactError(f"load: {root} is a file, not an artifact: pass the folder that "
                            "jaxaot.export.ExportedAOT.save wrote (the one holding manifest.json).")
    where = str(root / manifest.MANIFEST)
    info = manifest.read_manifest(root, max_bytes, key=key)
    try:  # check_manifest and from_json see a dict: errors name the file here
        manifest.check_manifest(info, check_versions=check_versions)
        signature = AOTSignature.from_json(info["signature"])
        signature.validate(where)
    except ArtifactError as err:
        if where in str(err):
            raise
        raise type(err)(f"{where}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError, OverflowError) as err:
        raise ArtifactError(f"{where} is malformed: {type(err).__name__}: {err}") from err
    programs = {name: manifest.load_program(root, name, info["artifacts"][name], max_bytes)
                for name in manifest.PROGRAMS}
    parts = {what: part for name, program in programs.items()
             for what, part in manifest.program_parts(name, program).items()}  # the programs and their vjps
    audit.check_platforms(parts, where)
    for name, program in parts.items():
        audit.check_program(name, program, where, allow_callbacks=allow_callbacks, allow_custom_calls=allowed,
                            declared=bool(info.get("host_callbacks")))
    audit.check_signature(programs, signature, where)
    audit.check_vjps(programs, where)
    loaded = LoadedAOT(ExportedAOT(name=info.get("function", "exported"), signature=signature, **programs),
                       where=str(root))
    audit.check_calls(parts, where)
    return loaded


@jax.tree_util.register_pytree_node_class
class ExportedResiduals:
    """What :meth:`LoadedAOT.forward` hands to :meth:`LoadedAOT.backward`.

    ``arrays`` are the residuals in the backward's order; ``input_shapes`` (the
    concrete input shapes) size the ``float0`` gradients of integer inputs.
    """

    def __init__(self, arrays: Sequence[Any], input_shapes: Sequence[tuple[int, ...]]):
        self.arrays = tuple(arrays)
        self.input_shapes = tuple(tuple(s) for s in input_shapes)

    def tree_flatten(self):
        return self.arrays, self.input_shapes

    @classmethod
    def tree_unflatten(cls, input_shapes, arrays):
        return cls(arrays, input_shapes)

    def __repr__(self) -> str:
        return f"ExportedResiduals({len(self.arrays)} arrays)"


class LoadedAOT:
    """A function rebuilt from exported programs: call it, differentiate it, or split it.

    ``jax.grad`` / ``jax.vjp`` run the exported forward and backward (a
    ``jax.custom_vjp``); :meth:`forward` / :meth:`backward` expose the split.
    Inputs are checked against the signature first (:class:`ArtifactInputError`).

    A sharded artifact (``num_devices > 1``) takes arrays on a mesh of
    ``num_devices`` devices, placed anyhow (each program reshards its inputs to
    the shardings it was exported for); its outputs, residuals and gradients
    come back with the exported shardings. Arrays on another number of devices
    are refused with an :class:`ArtifactError` naming both counts.

    Attributes:
      num_devices: how many devices the programs were exported for (1: any).
    """

    def __init__(self, exported: ExportedAOT, where: str | None = None):
        self.exported = exported
        self.signature = exported.signature
        self.__name__ = exported.name
        self.num_devices = max(int(getattr(p, "nr_devices", 1)) for p in (exported.inference, exported.forward,
                                                                             exported.backward))
        if self.num_devices > 1:
            check_enough_devices(where or f"the artifact of {self.__name__}", self.num_devices, self.signature.mesh)
        self._structures: dict[Any, Any] = {}
        self._jitted: dict[str, Any] = {}  # program ("inference", "forward", "backward") -> jax.jit of its call
        self._calls = CallLog(self)
        self._weak = WeakTyping(self.signature)
        exported_for = {p for prog in (exported.inference, exported.forward, exported.backward) for p in prog.platforms}
        self._other_platforms = bool(C.available_platforms() - exported_for)  # else every array is on one of them
        s = self.signature
        self._call = custom_vjp_of(SplitPrograms(
            primal=self._infer, forward=self._forward, backward=self._backward,
            num_inputs=len(s.in_specs), grad_inputs=tuple(s.grad_inputs),
            cotangent_outputs=tuple(s.cotangent_outputs),
            cotangent_dtypes=tuple(s.out_specs[i].dtype for i in s.cotangent_outputs),
        ))

    @property
    def inference(self) -> Any:
        return self.exported.inference

    def __copy__(self) -> "LoadedAOT":
        return LoadedAOT(self.exported)  # the same programs (never changed), a call log of its own

    def __deepcopy__(self, memo: dict) -> "LoadedAOT":
        return LoadedAOT(self.exported)

    def cache_info(self) -> CacheInfo:
        """The input shapes it ran for: one entry per shape (``jax.export`` programs compile per concrete
        shape on their first call), with the programs run for it and the reason, against the nearest
        shape seen before; nothing is traced or partitioned here, so ``times`` is empty.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.export.load(jaxaot.export.export(lambda x: jnp.sin(x).sum(), jnp.ones(3)))
            >>> _ = f(jnp.ones(3)); _ = f(jnp.zeros(3))
            >>> info = f.cache_info()
            >>> info.hits, info.misses, info.entries[0].executables
            (1, 1, ('inference',))
        """
        return self._calls.info()

    def __call__(self, *args: Any) -> Any:
        leaves = self._check_inputs(args)
        outs = self._infer(leaves) if _concrete(leaves) else self._call(*leaves)  # concrete: nothing to differentiate
        return jax.tree_util.tree_unflatten(self.signature.out_tree, outs)

    def forward(self, *args: Any) -> tuple[Any, ExportedResiduals]:
        """Run the exported forward: ``(outputs, residuals)``.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.export.load(jaxaot.export.export(lambda x: jnp.sin(x).sum(), jnp.ones(3)))
            >>> y, res = f.forward(jnp.zeros(3))
            >>> (dx,) = f.backward(res, jnp.float32(1.0))
            >>> dx.tolist()
            [1.0, 1.0, 1.0]
        """
        leaves = self._check_inputs(args)
        outs, residuals = self._forward(leaves)
        shapes = [np.shape(x) for x in leaves]
        return jax.tree_util.tree_unflatten(self.signature.out_tree, outs), ExportedResiduals(residuals, shapes)

    def backward(self, residuals: ExportedResiduals, cotangents: Any) -> tuple:
        """Run the exported backward: gradients shaped like the positional arguments.

        ``cotangents`` has the outputs' structure (leaves of integer outputs are
        ignored and may be None); integer inputs get ``float0`` zeros.
        """
        if not isinstance(residuals, ExportedResiduals):
            raise ResidualsMismatchError(f"backward expects the ExportedResiduals returned by {self.__name__}.forward, "
                                         f"got {type(residuals).__name__}.")
        self._check_residuals(residuals.arrays)
        grads = self._backward(residuals.arrays, self._check_cotangents(cotangents))
        float0s = [C.zeros_float0(s) for s in residuals.input_shapes]
        return jax.tree_util.tree_unflatten(self.signature.in_tree, scatter(self.signature.grad_inputs, grads, float0s))

    # -- placement
    def mesh(self, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
        """A mesh of the exported shape (axis names, sizes and types) over ``devices`` (default: the first ones);
        an :class:`ArtifactError` for an artifact exported without a mesh."""
        if self.signature.mesh is None:
            raise ArtifactError(f"{self.__name__} was exported from unsharded inputs: it has no mesh and runs on "
                                "any one device (or any mesh).")
        return self.signature.mesh.make(devices)

    def in_shardings(self, mesh: jax.sharding.Mesh | None = None) -> Any:
        """Where each positional argument goes on ``mesh`` (default :meth:`mesh`): a pytree of ``NamedSharding``.

        ``jax.device_put(args, f.in_shardings(mesh))`` places arguments for a call.
        Inputs the export left unsharded are replicated.
        """
        mesh = self.mesh() if mesh is None else mesh
        everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        flat = [everywhere if s is None else s for s in self.exported.forward.in_shardings_jax(mesh)]
        return jax.tree_util.tree_unflatten(self.signature.in_tree, flat)

    # -- programs
    def _refuse_forward_mode(self, leaves: Sequence[Any]) -> None:
        # jax.custom_vjp has no forward mode: JAX's own refusal comes late (at the tangents' evaluation, or when
        # jit lowers) and untyped. Values of jax.jvp (and jacfwd, hessian) are its tracers; with
        # jax_use_direct_linearize off, jax.grad's are too, and custom_vjp takes them.
        if getattr(jax.config, "jax_use_direct_linearize", True) and any(map(C.is_forward_mode_tracer, leaves)):
            raise ArtifactJvpError(
                f"jax.jvp of {self.__name__}, a loaded artifact, is not supported (nor jax.jacfwd, jax.hessian or "
                "any other forward mode): its exported programs are differentiated through jax.custom_vjp, which "
                "has reverse mode only. Use reverse mode (jax.grad, jax.vjp), or export a function "
                "that computes the jvp: jaxaot.export.export(lambda x, t: jax.jvp(f, (x,), (t,)), x, t).")

    def _run(self, program: Any, what: str, leaves: Sequence[Any]) -> list:
        self._refuse_forward_mode(leaves)
        check_call_devices(self.__name__, what, self.num_devices, self.signature.mesh, leaves)
        if self._other_platforms:
            check_call_platform(self.__name__, what, tuple(program.platforms), leaves)
        if any(map(C.is_batch_tracer, leaves)):  # jax.export's programs have no batching rule
            raise ArtifactVmapError(
                f"jax.vmap of {self.__name__}, a loaded artifact, is not supported: its exported {what} program "
                "has no batching rule. Export the vmapped function instead (jaxaot.export.export(jax.vmap(f), "
                "*batched_args)), or map this one over the batch with jax.lax.map.")
        if _concrete(leaves):  # ``Exported.call`` traces itself at every eager call: jitted once, it dispatches
            return list((self._jitted.get(what) or self._jitted.setdefault(what, jax.jit(program.call)))(*leaves))
        return list(differentiable_call(program, self.__name__, what)(*leaves))

    def _infer(self, leaves: Sequence[Any]) -> list:
        self._calls.ran(shapes_of(leaves), "inference")
        outs = self._run(self.exported.inference, "inference", leaves)
        n = self.signature.num_outputs
        return self._weak.outputs_typed(_checked(outs[n:], self.signature.inference_checks, outs[:n]))

    def _forward(self, leaves: Sequence[Any]) -> tuple[list, list]:
        s = self.signature
        outs = self._run(self.exported.forward, "forward", leaves)
        n = s.num_outputs + s.num_temporaries
        residuals = [leaves[i] for i in s.saved_inputs] + [outs[i] for i in s.saved_outputs]
        checked = _checked(outs[n:], s.forward_checks, [*outs[: s.num_outputs], *residuals])
        self._calls.ran(shapes_of(leaves), "forward", shapes_of(residuals))
        return self._weak.outputs_typed(checked[: s.num_outputs]), checked[s.num_outputs:]

    def _backward(self, residuals: Sequence[Any], cts: Sequence[Any]) -> list:
        self._calls.ran_backward(shapes_of(residuals))
        return self._weak.grads_typed(self._run(self.exported.backward, "backward", [*cts, *residuals]), cts)

    # -- checks
    def _structure(self, treedef: Any) -> Any:
        # Compared as JSON: a namedtuple of the same name and fields matches.
        st = self._structures.get(treedef)
        if st is None:
            try:
                st = treedef_to_json(treedef, "arg")
            except NotExportableError:
                st = repr(treedef)
            self._structures[treedef] = st
        return st

    def _check_inputs(self, args: tuple) -> list:
        s = self.signature
        leaves, treedef = jax.tree_util.tree_flatten(args)
        if self._structure(treedef) != s.in_structure:
            raise ArtifactInputError(
                _static_note(self.__name__, s) + f"{self.__name__} takes positional arguments structured as "
                f"{s.in_tree} (leaves {', '.join(s.in_paths)}), got {treedef}."
            )
        bound: dict[str, tuple[int, str]] = {}
        for path, spec, x in zip(s.in_paths, s.in_specs, leaves):
            _check_leaf(path, spec, x, bound, ArtifactInputError, input_=True)
        check_compound_dims(s.in_paths, s.in_specs, leaves, bound, ArtifactInputError)
        check_constraints(s.dim_constraints, bound, ArtifactInputError)
        self._refuse_forward_mode(leaves)
        self._calls.look_up(shapes_of(leaves))
        return leaves

    def _check_residuals(self, arrays: Sequence[Any]) -> None:
        specs = self.signature.residual_specs
        if len(arrays) != len(specs):
            raise ResidualsMismatchError(f"expected {len(specs)} residuals, got {len(arrays)}.")
        bound: dict[str, tuple[int, str]] = {}
        for i, (spec, x) in enumerate(zip(specs, arrays)):
            _check_leaf(f"residual {i}", spec, x, bound, ResidualsMismatchError)
        check_compound_dims([f"residual {i}" for i in range(len(specs))], specs, arrays, bound, ResidualsMismatchError)

    def _check_cotangents(self, cotangents: Any) -> list:
        s = self.signature
        flat, tree = jax.tree_util.tree_flatten(cotangents, is_leaf=lambda x: x is None)
        if len(flat) != s.num_outputs:
            raise CotangentMismatchError(f"cotangents have structure {tree} but the outputs have {s.out_tree}.")
        def check(what: str, i: int, ct: Any) -> None:
            _check_leaf(what, s.out_specs[i], ct, {}, CotangentMismatchError)

        return select_cotangents(flat, s.cotangent_outputs, s.out_paths, check)

    def __repr__(self) -> str:
        s = self.signature
        return f"<LoadedAOT {self.__name__}: {', '.join(f'{p}: {spec}' for p, spec in zip(s.in_paths, s.in_specs))}>"


def _static_note(name: str, s: AOTSignature) -> str:
    """What a call that does not fit should know of the static arguments fixed at export ("" without any)."""
    if s.static_args is None:
        return ""
    nums, value = s.static_argnums, s.static_args
    if len(nums) == 1 and value.startswith("(") and value.endswith(",)"):
        fixed = f"argument {nums[0]} fixed to {value[1:-2]} (static_argnums={nums})"
    elif nums:
        fixed = f"arguments {nums} fixed to {value} (static_argnums={nums})"
    else:
        fixed = f"the static arguments {value} fixed"
    return (f"{name} was exported with {fixed}: the loaded function takes only the other "
            f"{len(s.in_tree.children())} positional argument(s). Call it without the static ones; another value "
            "needs another export. ")


def _check_leaf(path: str, spec: ArraySpec, x: Any, bound: dict, error: type[Exception], input_: bool = False) -> None:
    """Raise ``error`` unless ``x`` has ``spec``'s dtype and shape (binding symbolic dims); an ``input_``
    exported weakly typed also takes only a weakly typed ``x`` (:func:`weak_input_note`)."""
    got = shape_and_dtype_name(x)
    if got is None:
        raise error(f"{path} is a {type(x).__name__}, not an array: expected {spec}.")
    shape, dtype = got
    mismatch = dtype != spec.dtype or len(shape) != len(spec.shape)
    for want, have in zip(spec.shape, shape):
        if isinstance(want, int):
            mismatch = mismatch or want != have
        elif str(want).isidentifier():  # a plain dimension variable: bind it
            if have < 1:
                raise error(f"{path}: dimension '{want}' is {have} here, and jax.export's symbolic dimensions are "
                            f"at least 1 (expected {spec}, got {dtype}[{','.join(map(str, shape))}]). Call the "
                            f"function before export for an empty batch, or skip the call.")
            first = bound.setdefault(want, (have, path))
            if first[0] != have:
                raise error(
                    f"{path}: dimension '{want}' is {have} here but {first[0]} in {first[1]} "
                    f"(expected {spec}, got {dtype}[{','.join(map(str, shape))}])."
                )
    weak = weak_input_note(path, spec, x, dtype) if input_ and spec.weak_type else ""
    if mismatch:
        wide = spec.dtype in audit.WIDE and not jax.config.jax_enable_x64
        raise error(f"{path}: expected {spec}, got {dtype}[{','.join(map(str, shape))}]." + (
            f" The artifact takes {spec.dtype} inputs, which JAX makes only with jax_enable_x64: call it under "
            f"jax.config.update('jax_enable_x64', True)." if wide else "") + (weak if dtype != spec.dtype else ""))
    if weak:
        raise error(weak)


def _checked(flags: Sequence[Any], checks: Sequence[RuntimeCheck], values: Sequence[Any]) -> list:
    """``values`` after the program's overflow flags: a :class:`LoopOverflowError` for a concrete one that is
    true; under ``jit``, NaN values and the overflow recorded for ``jaxaot.loops.reraise_overflow``, as the
    function before export gives."""
    for flag, check in zip(flags, checks):
        if not C.is_tracer(flag) and np.any(np.asarray(flag)):
            raise LoopOverflowError(
                f"while_loop needed more than max_steps={check.max_steps} iterations (raised by the exported "
                "forward). Its reverse mode stacks at most max_steps carries: re-export with a larger max_steps, "
                "or with checkpoints=k instead.")
    return checked_values(flags, [c.max_steps for c in checks], values)


def _concrete(leaves: Sequence[Any]) -> bool:
    """Whether a call runs on values, outside any transformation (no autodiff or staging to serve)."""
    return C.is_eval_trace(C.current_trace()) and not any(map(C.is_tracer, leaves))
