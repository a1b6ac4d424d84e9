"""The fused training step: forward and backward in one executable that keeps the partition's plan.

Two executables cost a training step twice: two launches, and XLA can neither
fuse nor choose layouts across the boundary. When the caller only wants
``value_and_grad`` of a scalar loss (:func:`jaxaot.value_and_grad` on an
:class:`~jaxaot.AOTFunction`), there is no boundary to keep, so this module
compiles one program::

    outputs, residuals = forward(inputs)             # the partition's forward
    residuals' = optimization_barrier(residuals)
    grads = backward(unit cotangents, residuals')    # the partition's backward

The barrier is how ``jax.checkpoint`` lowers: the backward sees only the
residuals, through a value XLA cannot look through, so the eqns it recomputes
are not merged with the forward's copies (which would keep alive what the plan
chose not to save). The peak memory is then the plan's, not the fused
``jax.jit(jax.value_and_grad)``'s. Every residual passes the barrier (the
default, ``barrier="all"``). Only those the recomputation reads need it for the
plan's sake (``barrier="recomputed"``; the recomputed eqns are the backward's
eqns that no cotangent reaches), but letting XLA see the others measured worse
on an H200 (Llama block: 1.039x ``jit(value_and_grad)`` and 1.021x the peak of
``dots_saveable`` against 1.010x and 1.002x with every residual behind the
barrier; ``benchmarks/results/fused_gpu_h200_2026-11-23_barrier.txt``). A
partition that recomputes nothing has no barrier, and the default partition
(which saves what ``jax.vjp`` saves and recomputes only constants) takes
``"recomputed"``: behind a full barrier its residuals measured 1.19x
``jit(value_and_grad)`` and 1.35x its peak on that Llama block
(``fused_gpu_h200_2026-11-26_b.txt``), 1.04x and 1.00x without
(``..._2026-11-23_barrier.txt``).

The cotangent of the loss (1, and 0 for auxiliary outputs) is a constant of
the program; on a mesh the gradients are pinned to their inputs' shardings.
Residuals the partition offloaded (:mod:`jaxaot.partition.offload`) make the
same trip inside the one program: its forward part copies them to
``pinned_host`` and its backward part copies them back, so between the two
they cost the device no memory.

A residual the backward only slices (an attention block's fused QKV projection)
passes the barrier as its slices, so each is freed after its last reader
(:mod:`jaxaot.runtime.residual_slices`). A residual the backward can derive
again through an order-free reduction (a softmax's row max, from the scores it
recomputes) may be dropped from the residuals, where that lowers the compiled
peak (:mod:`jaxaot.runtime.rederive`, :func:`choose_rederive`).

Layouts: between two executables every residual is row-major; inside one
program XLA chooses the residuals' layouts for the forward and the backward
together, and on some models pays for its choice in transposes (an H200 ViT
block ran 1.075x ``jit(value_and_grad)`` fused against 0.953x with the
residuals pinned row-major). A residual the backward reads only through one
transpose (attention scores as their matmul wrote them) is pinned in the order
that transpose reads it instead (:func:`read_orders`), so the backward's
elementwise work runs in that order: on an H100 Llama block, whose scores the
einsum writes with the 4-wide query group minor, the step in XLA's order went
from 1.002x ``jit(value_and_grad)`` to 0.880x, and its peak from 0.999x to
0.831x ``dots_saveable``'s, because the score gradient's float32 copy had been
transposed into that order (450 us of a 2.5 ms step on an H200;
``benchmarks/results/probe_read_order_gpu_h100_2026-11-26_*.txt``,
``probe_kernel_times_gpu_h200_2026-11-26_llama_block.txt``). On an accelerator
the step is compiled with XLA's layouts and pinned, and :func:`choose_layouts`
keeps one, by compiled peak memory; where
the backward reads a recomputed matmul operand, once more in the consume-first
order (:mod:`jaxaot.runtime.ordering`), kept by :func:`choose_order`. Then a
step that recomputes is compiled without the barrier and kept if its compiled
peak is no higher (:func:`choose_barrier`): the barrier exists for memory, and
where XLA's own schedule needs no more, it only forbids fusions. Last, where the
backward can derive a saved reduction again, once more doing so (:func:`choose_rederive`).

Cost: one more compilation per signature, up to five on an accelerator (the split
executables compile only if ``.forward``/``.backward`` or a pipeline asks for
them). Functions with a
``jaxaot.while_loop`` whose stack the runtime sizes keep the split
executables: the runtime checks the loop's trip count between the two.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> f = jaxaot.aot_function(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2))
    >>> w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
    >>> _ = jaxaot.value_and_grad(f)(w, x)
    >>> [name for name in f.cache_info().entries[0].executables]
    ['fused[0]']
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from jaxaot import _compat as C
from jaxaot.errors import InvalidValueError
from jaxaot.partition import cost_model
from jaxaot.partition.default import default_partition
from jaxaot.runtime import ordering, residual_slices
from jaxaot.runtime.rederive import rederive_backward


def recomputation_inputs(backward: Any, num_cotangents: int) -> set[int]:
    """Positions (among the residuals) of the backward's residual inputs that its recomputed eqns read.

    An eqn is recomputation when no cotangent reaches it (a call or loop counts
    as one eqn). Costs one pass over the backward's top-level eqns.
    """
    jaxpr = C.jaxpr_of(backward)
    reached = set(map(id, jaxpr.invars[:num_cotangents]))
    position = {id(v): i for i, v in enumerate(jaxpr.invars[num_cotangents:])}
    read: set[int] = set()
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not C.is_literal(v)]
        if any(id(v) in reached for v in ins):
            reached.update(id(v) for v in eqn.outvars)
        else:
            read.update(position[id(v)] for v in ins if id(v) in position)
    return read


def library_kernel_residuals(part: Any, num_cotangents: int) -> set[int]:
    """Positions (among the residuals) of those a library kernel (a cuDNN convolution,
    :func:`jaxaot.partition.cost_model.materializes_operands`) reads or writes, in the forward or the
    backward (top-level eqns). The backend picks such a kernel's operand layouts (NHWC for cuDNN);
    pinning them row-major adds a transpose on each side (H200 ConvNet: 1.10x against 1.03x).
    """
    fwd, bwd = C.jaxpr_of(part.forward), C.jaxpr_of(part.backward)
    touched = {id(v) for j in (fwd, bwd) for e in j.eqns if cost_model.materializes_operands(e)
               for v in (*e.invars, *e.outvars) if not C.is_literal(v)}
    residual_vars = bwd.invars[num_cotangents:]
    produced = [fwd.invars[i] for i in part.saved_inputs] + [fwd.outvars[i] for i in part.saved_outputs]
    return {i for i, (a, b) in enumerate(zip(produced, residual_vars)) if id(a) in touched or id(b) in touched}


def read_orders(backward: Any, num_cotangents: int) -> dict[int, tuple[int, ...]]:
    """``{position among the residuals: major-to-minor order}`` for the residuals that the backward
    reads only through transposes of one permutation (and does not return): stored in that order,
    each transpose reads them row-major (a bitcast). Top-level eqns; the others are absent.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot.runtime.fused import read_orders
        >>> bwd = jax.make_jaxpr(lambda g, s, w: (g * s.T, w @ g))(jnp.ones((3, 2)), jnp.ones((2, 3)),
        ...                                                         jnp.ones((3, 3)))
        >>> read_orders(bwd, 1)  # s is read only as s.T; w by a matmul
        {0: (1, 0)}
    """
    out = {}
    for i, eqns in enumerate(residual_slices.residual_readers(backward, num_cotangents)):
        perms = {tuple(e.params["permutation"]) if e is not None and e.primitive.name == "transpose" else None
                 for e in eqns}
        if len(perms) == 1 and None not in perms:
            out[i] = perms.pop()
    return out


def pinned_layouts(part: Any, num_cotangents: int) -> dict[int, tuple[int, ...] | None]:
    """``{position among the residuals: major-to-minor order}`` of the residuals ``layouts="pinned"``
    pins: every one but those a library kernel reads or writes (:func:`library_kernel_residuals`),
    row-major (None) unless the backward reads a forward value only transposed (:func:`read_orders`).
    Inputs arrive row-major and stay alive: another order would be a second, transposed copy."""
    library = library_kernel_residuals(part, num_cotangents)
    orders = read_orders(part.backward, num_cotangents)
    n_in, n = len(part.saved_inputs), len(part.saved_inputs) + len(part.saved_outputs)
    return {i: orders.get(i) if i >= n_in else None for i in range(n) if i not in library}


def barred_residuals(part: Any, barrier: str) -> set[int]:
    """Positions (among the residuals of the partition ``part``) that ``barrier`` passes through
    ``optimization_barrier``: none when nothing is recomputed or ``barrier="none"`` (XLA may then
    optimize across, as in ``jit(value_and_grad)``), those the recomputation reads for
    ``"recomputed"``, every one for ``"all"``."""
    if not part.recomputed or barrier == "none":
        return set()
    if barrier == "recomputed":
        return recomputation_inputs(part.backward, len(part.cotangent_outputs))
    return set(range(len(part.saved_inputs) + len(part.saved_outputs)))


def fused_program(training: Any, value_leaf: int = 0, barrier: str = "all", layouts: str = "auto",
                  order: str = "xla", slices: bool = True, rederive: bool = False) -> Any:
    """The closed jaxpr ``inputs -> (outputs..., grads...)`` of one step (see the module docstring).

    ``training`` is a :class:`~jaxaot.runtime.programs.TrainingPrograms`;
    ``value_leaf`` the output whose cotangent is 1 (the loss); ``barrier``
    which residuals pass through ``optimization_barrier``: ``"all"``,
    ``"recomputed"`` (those the recomputation reads) or ``"none"`` (XLA may
    then merge recomputed eqns with the forward's, saving more than the plan);
    ``layouts``: ``"auto"`` lets XLA choose the residuals' layouts,
    ``"pinned"`` pins them (:func:`pinned_layouts`): to the layout they have between two
    executables (row-major), or, where the backward reads a forward value only through one
    transpose, to that transpose's order;
    ``order``: ``"xla"`` leaves the backward's order to XLA, ``"consume_first"`` makes every
    recomputed matmul operand be used before its residuals are read again
    (:mod:`jaxaot.runtime.ordering`); ``slices``: residuals behind the barrier that the backward
    only slices pass it as their slices (:mod:`jaxaot.runtime.residual_slices`); ``rederive``: the
    backward derives again the residuals it can through an order-free reduction, and they are not
    passed (:mod:`jaxaot.runtime.rederive`).
    """
    p, part, joint = training.programs, training.partition, training.joint
    cts = [(i, joint.out_avals[i]) for i in part.cotangent_outputs]
    pins = training.placement.grad_pins()
    n_res = len(part.saved_inputs) + len(part.saved_outputs)
    lean = rederive_backward(part, len(cts)) if rederive else None
    passed = lean.kept if lean is not None else tuple(range(n_res))
    barred = barred_residuals(part, barrier)
    behind = {j for j, k in enumerate(passed) if k in barred}

    if layouts not in ("auto", "pinned"):
        raise InvalidValueError(f'layouts must be "auto" or "pinned", got {layouts!r}.')
    layout_of = pinned_layouts(part, len(cts)) if layouts == "pinned" else {}
    backward = lean.backward if lean is not None else part.backward
    sliced = residual_slices.split_backward(backward, len(cts), behind) if slices and behind else None
    backward = sliced.backward if sliced is not None else backward

    def step(*leaves: Any) -> list:
        fwd = C.eval_closed(part.forward, *leaves)
        residuals = [leaves[i] for i in part.saved_inputs] + [fwd[i] for i in part.saved_outputs]
        residuals = [C.pin_layout(r, layout_of[i]) if i in layout_of else r for i, r in enumerate(residuals)]
        residuals = [residuals[k] for k in passed]
        owner = list(range(len(residuals)))
        if sliced is not None:
            residuals, owner = sliced.expand(residuals)
        kept = [r for r, i in zip(residuals, owner) if i in behind]
        kept = iter(jax.lax.optimization_barrier(kept) if kept else [])
        residuals = [next(kept) if i in behind else r for r, i in zip(residuals, owner)]
        unit = [jax.numpy.full(a.shape, 1 if i == value_leaf else 0, a.dtype) for i, a in cts]
        if order == "consume_first" and part.recomputed:
            grads = ordering.eval_backward(backward, len(cts), *unit, *residuals)
        else:
            grads = C.eval_closed(backward, *unit, *residuals)
        grads = [g if s is None else jax.lax.with_sharding_constraint(g, s) for g, s in zip(grads, pins)]
        return [fwd[i] for i in p.computed_outputs] + grads

    return jax.make_jaxpr(step)(*p.in_avals)


def default_barrier(training: Any) -> str:
    """``"recomputed"`` for the default partition (it saves what ``jax.vjp`` saves and recomputes only
    constants: behind a barrier its residuals measured 1.19x ``jit(value_and_grad)`` and 1.35x its peak
    on an H200 Llama block, against 1.04x and 1.00x with ``"recomputed"``), else ``"all"``."""
    return "recomputed" if training.options.partition_fn is default_partition else "all"


#: Backends whose layout assignment can differ from row-major inside one program (CPU's does not).
LAYOUT_CHOICE_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})
#: How much more peak memory the row-major step may need and still be chosen (see :func:`choose_layouts`).
LAYOUT_PEAK_SLACK = 0.005


def compiled_peak(exe: Any) -> int | None:
    """Peak device bytes of a compiled executable, where the backend reports it (XLA:CPU's
    ``peak_memory_in_bytes`` leaves out temporaries: then the sum of the parts)."""
    try:
        ma = exe.memory_analysis()
    except Exception:  # noqa: BLE001  (backends without memory analysis)
        return None
    if ma is None:
        return None
    peak = int(getattr(ma, "peak_memory_in_bytes", 0) or 0)
    if peak >= ma.temp_size_in_bytes and peak:
        return peak
    return int(ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes)


def choose_layouts(auto_peak: int | None, pinned_peak: int | None) -> str:
    """``"pinned"`` unless pinning the residuals' layouts costs more than
    :data:`LAYOUT_PEAK_SLACK` of XLA's own choice in peak memory (or a peak is unknown): ``"auto"``.

    Inside one program XLA picks the residuals' layouts for forward and backward together. On an
    H200 ViT block it picked batch-minor layouts for the residual stream and paid nine more
    transpose kernels than the two split executables (fused min-cut 1.075x ``jit(value_and_grad)``,
    pinned 0.953x, peak 0.97x); on the Llama block 1.056x against 0.953x at equal peak. Where XLA's
    layouts serve a consumer (the MoE's dispatch einsums) pinning costs a transposed copy, which
    shows as peak memory (1.14x there), so that case keeps XLA's choice
    (``benchmarks/results/probe_fused_layouts_gpu_h200_2026-11-26.txt``).

    Example:
        >>> from jaxaot.runtime.fused import choose_layouts
        >>> choose_layouts(1000, 1004), choose_layouts(1000, 1100), choose_layouts(None, 10)
        ('pinned', 'auto', 'auto')
    """
    if auto_peak is None or pinned_peak is None:
        return "auto"
    return "pinned" if pinned_peak <= auto_peak * (1 + LAYOUT_PEAK_SLACK) else "auto"


def _platform(exe: Any) -> str | None:
    shardings = jax.tree.leaves(getattr(exe, "input_shardings", None))
    devices = next(iter(shardings)).device_set if shardings else set()
    return next(iter(devices)).platform if devices else None


#: How much lower the consume-first step's compiled peak must be to be chosen (see :func:`choose_order`).
ORDER_PEAK_GAIN = 0.01


def choose_order(xla_peak: int | None, ordered_peak: int | None) -> str:
    """``"consume_first"`` when that backward order (:mod:`jaxaot.runtime.ordering`) lowers the
    compiled peak by more than :data:`ORDER_PEAK_GAIN`, else ``"xla"``.

    The order costs one more read of the residuals it sequences, so it is kept only where
    XLA's own order (a recomputed matmul operand merged into a later kernel) raised the peak.

    Example:
        >>> from jaxaot.runtime.fused import choose_order
        >>> choose_order(1000, 995), choose_order(1000, 900), choose_order(None, 10)
        ('xla', 'consume_first', 'xla')
    """
    if xla_peak is None or ordered_peak is None:
        return "xla"
    return "consume_first" if ordered_peak < xla_peak * (1 - ORDER_PEAK_GAIN) else "xla"


def choose_barrier(barrier: str, barriered_peak: int | None, free_peak: int | None) -> str:
    """``"none"`` when the step without the optimization barrier compiles to a peak no higher than
    with it, else ``barrier``.

    The barrier is there so that XLA keeps no more than the plan saves. Where XLA's own schedule of
    the same step, free to merge recomputation with the forward, needs no more memory at its peak,
    the barrier buys nothing and costs the fusions it forbids: on an H100 ConvNet with batch norm the
    barriered min-cut step ran 1.045x ``jit(value_and_grad)`` at 1.055x its peak, the free one ran as
    ``jit(value_and_grad)`` (``benchmarks/results/probe_layout_choice_gpu_h100_2026-11-26_*.txt``).

    Example:
        >>> from jaxaot.runtime.fused import choose_barrier
        >>> choose_barrier("all", 1000, 950), choose_barrier("all", 1000, 1001), choose_barrier("all", None, 5)
        ('none', 'all', 'all')
    """
    if barriered_peak is None or free_peak is None:
        return barrier
    return "none" if free_peak <= barriered_peak else barrier


#: How much lower the compiled peak must be for the step that derives reductions again (see
#: :func:`choose_rederive`).
REDERIVE_PEAK_GAIN = 0.005


def choose_rederive(peak: int | None, rederived_peak: int | None) -> bool:
    """Whether to keep the step whose backward derives order-free reductions again
    (:mod:`jaxaot.runtime.rederive`): when its compiled peak is lower by more than
    :data:`REDERIVE_PEAK_GAIN`.

    Deriving a max again is one more pass over a value the backward recomputes anyway, free where
    XLA fuses it into that value's readers and a read where it does not; kept only for memory. On
    an H100 16-head GPT-2 block the peak fell from 1.001x to 0.983x ``dots_saveable``'s, and the
    2-head block's rose 1.060x (``benchmarks/results/probe_max_recompute_gpu_h100_2026-11-26_*.txt``).

    Example:
        >>> from jaxaot.runtime.fused import choose_rederive
        >>> choose_rederive(1000, 980), choose_rederive(1000, 998), choose_rederive(None, 10)
        (True, False, False)
    """
    if peak is None or rederived_peak is None:
        return False
    return rederived_peak < peak * (1 - REDERIVE_PEAK_GAIN)


def _compile_variant(training: Any, name: str, value_leaf: int, barrier: str, returned: set,
                     layouts: str, order: str, rederived: tuple[int, ...] = ()) -> Any:
    """The step compiled with this ``barrier``, ``layouts``, ``order`` and residual positions
    ``rederived`` (which it carries as attributes, the last as the residuals' descriptions), or
    None where the backend refuses it."""
    p = training.programs
    key = f"{name}:{layouts}:{order}:{barrier}:{len(rederived)}"
    try:
        exe = p.compile(key, training.options.fw_compiler,
                        fused_program(training, value_leaf, barrier=barrier, layouts=layouts, order=order,
                                      rederive=bool(rederived)),
                        p.in_avals, aliased=returned)
    except Exception:  # noqa: BLE001  (a layout this backend cannot pin: keep XLA's choice)
        return None
    finally:
        p.executables.pop(key, None)
    exe.layouts, exe.order, exe.barrier = layouts, order, barrier
    exe.rederived = tuple(str(training.partition.residuals[k]) for k in rederived)
    return exe


def fused_exe(training: Any, value_leaf: int = 0) -> Any:
    """The fused step's executable, compiled (through the persistent cache) on first use.

    On an accelerator (:data:`LAYOUT_CHOICE_PLATFORMS`) the step is compiled with XLA's layouts
    for the residuals and with them pinned (row-major, or as the backward reads them), and
    :func:`choose_layouts` keeps one; where
    the backward reads a recomputed matmul operand it is compiled once more in the consume-first
    order, kept by :func:`choose_order`; where the plan recomputes, once more without the barrier,
    kept by :func:`choose_barrier`; where the backward can derive a saved reduction again
    (:mod:`jaxaot.runtime.rederive`), once more doing so in XLA's order, kept by
    :func:`choose_rederive`. The executable's ``layouts`` (``"auto"`` or ``"pinned"``),
    ``order`` (``"xla"`` or ``"consume_first"``), ``barrier`` (``"all"``, ``"recomputed"`` or
    ``"none"``) and ``rederived`` (the residuals derived again) attributes say which.
    """
    p = training.programs
    name = "fused" + training.name_suffix + ("" if value_leaf == 0 else f"@{value_leaf}")
    exe = p.executables.get(name)
    if exe is None:
        returned = {i for i in p.output_is_input if i is not None}  # handed back as outputs: never donated
        barrier, part = default_barrier(training), training.partition
        exe = p.compile(name, training.options.fw_compiler, fused_program(training, value_leaf, barrier=barrier),
                        p.in_avals, aliased=returned)
        exe.layouts, exe.order, exe.barrier, exe.rederived = "auto", "xla", barrier, ()
        if _platform(exe) in LAYOUT_CHOICE_PLATFORMS:
            variant = functools.partial(_compile_variant, training, name, value_leaf, returned=returned)
            pinned = variant(barrier, layouts="pinned", order="xla")
            if pinned is not None and choose_layouts(compiled_peak(exe), compiled_peak(pinned)) == "pinned":
                exe = pinned
            if part.recomputed and ordering.ordered_eqns(part.backward, len(part.cotangent_outputs)):
                ordered = variant(barrier, layouts=exe.layouts, order="consume_first")
                if ordered is not None and choose_order(compiled_peak(exe), compiled_peak(ordered)) != "xla":
                    exe = ordered
            if barred_residuals(part, barrier):
                free = variant("none", layouts=exe.layouts, order="xla")
                if free is not None and choose_barrier(barrier, compiled_peak(exe), compiled_peak(free)) == "none":
                    exe = free
            rederived = rederive_backward(part, len(part.cotangent_outputs)).rederived if part.recomputed else ()
            if rederived:
                lean = variant(exe.barrier, layouts=exe.layouts, order="xla", rederived=rederived)
                if lean is not None and choose_rederive(compiled_peak(exe), compiled_peak(lean)):
                    exe = lean
        p.executables[name] = exe
    return exe


def run_fused(training: Any, leaves: list, value_leaf: int = 0) -> tuple[list, list]:
    """``(the function's outputs, grads of the differentiated inputs)`` from one fused call."""
    p = training.programs
    outs = fused_exe(training, value_leaf)(*leaves)
    n = len(p.computed_outputs)
    return p.splice(leaves, outs[:n]), list(outs[n:])
