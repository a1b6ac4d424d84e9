"""The stages of one signature, shaped like JAX's: ``lower()`` then ``compile()``.

``aot_fn.lower(*args)`` traces, partitions and returns an :class:`AOTLowered`: the
programs, the :class:`~jaxaot._src.runtime.residual_table.ResidualTable`, the
recomputed eqns, each stage's time and StableHLO. :meth:`AOTLowered.compile`
returns an :class:`AOTCompiled` holding the executables the function then runs
(a gradient's fused training step among them, under ``"step"``, where its call runs
that step), the backend's memory and cost analyses, and the training step's compiled peak.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
    >>> sorted(low.compile_times)  # nothing compiled yet
    ['joint', 'partition', 'trace']
    >>> compiled = low.compile()
    >>> sorted(compiled.memory_analysis()["forward"])[:2]
    ['alias_size_in_bytes', 'argument_size_in_bytes']
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax

from jaxaot._src import display as _display
from jaxaot._src.compile import as_function
from jaxaot._src.fusion import compiled_peak, fused_choice, fused_exe, fused_name
from jaxaot._src.partition import Partition, Residual, StepPeak
from jaxaot._src.runtime.training import TrainingPrograms
from jaxaot._src.runtime.residual_table import ResidualTable
from jaxaot._src.runtime import stage_types
from jaxaot._src.tracing import JointGraph

PROGRAMS = ("inference", "forward", "backward")
#: The key of the fused training step among a compiled stage's executables and analyses.
STEP = "step"
#: Rows of the residual table a summary (``str()``) shows; ``details()`` shows them all.
SUMMARY_ROWS = 5


def _stage_times(training: TrainingPrograms) -> dict[str, float]:
    """This training's stage times under plain names (``joint``, ``compile_forward``, ...).

    The runtime keys the programs of a partial differentiation mask ``forward[0,2]``
    (the differentiated input leaves); one split's report drops that suffix.
    """
    suffix = training.name_suffix
    out = {}
    for key, seconds in training.programs.times.items():
        if key == "trace" or key == "compile_inference":
            out[key] = seconds
        elif suffix and key.endswith(suffix):
            out[key[: -len(suffix)]] = seconds
        elif not suffix and "[" not in key:
            out[key] = seconds
    return out


class AOTLowered:
    """Everything jaxaot built for one input signature, before compiling (from ``aot_fn.lower``).

    Attributes:
      joint: the :class:`~jaxaot.partition.JointGraph`.
      partition: the :class:`~jaxaot.partition.Partition`.
      inference / forward / backward: closed jaxprs of the three programs.
      residuals: the saved values as a :class:`ResidualTable` (inputs labelled by
        pytree path; ``added_bytes`` apart from the inputs' bytes; each ``saved``
        or ``offloaded`` to host memory, and ``offload_note`` why none was).
      saved: the :class:`~jaxaot.partition.Residual` of each saved value; ``saved_bytes`` their bytes.
      recomputed: forward eqns the backward recomputes.
      compile_times: seconds spent in each stage so far (``trace``, ``joint``, ``partition``).
      runs_step: whether the compiled stage's call is ``jaxaot.value_and_grad``'s (or ``jaxaot.grad``'s) fused
        step where the training fuses (``fused=True``); False for the function's own stage, which runs its outputs.
      in_tree / args_info: as ``jax.jit(f).lower(...)``'s: the pytree of the dynamic inputs ``(args, kwargs)``
        (static arguments left out), and per input a ``jax.stages.ArgInfo`` (its aval, whether it is ``donated``).
      out_info / out_tree: a ``jax.ShapeDtypeStruct`` per output of the compiled stage's call, and their pytree:
        the function's outputs, or a gradient's (``(value, grads)``, evaluated abstractly on first read).
    """

    def __init__(self, training: TrainingPrograms, call: Callable[[tuple, dict], Any], runs_step: bool = False):
        self._training = training
        self._call = call  # what the compiled stage runs, arguments checked (runtime.function.stage_call)
        self.runs_step = runs_step
        self.joint: JointGraph = training.joint
        self.partition: Partition = training.partition
        self.inference = training.programs.inference_program
        self.compile_times: Mapping[str, float] = _stage_times(training)

    @property
    def forward(self) -> Any:
        return self.partition.forward

    @property
    def backward(self) -> Any:
        return self.partition.backward

    @property
    def saved(self) -> tuple[Residual, ...]:
        return self.partition.residuals

    @property
    def saved_bytes(self) -> int:
        return self.partition.saved_bytes

    @property
    def device_saved_bytes(self) -> int:
        """Saved bytes that stay in device memory, ``saved_bytes`` less those offloaded to host memory."""
        return self.partition.device_saved_bytes

    @property
    def recomputed(self) -> tuple[str, ...]:
        return tuple(self.partition.recomputed)

    @functools.cached_property
    def residuals(self) -> ResidualTable:
        return ResidualTable.of(self.partition, self.joint, self._training.placement.known_residuals())

    @property
    def in_tree(self) -> Any:
        return self._training.programs.signature.treedef

    @property
    def args_info(self) -> Any:
        return stage_types.args_info(self._training.programs)

    @functools.cached_property
    def out_info(self) -> Any:
        return stage_types.out_info(self._training.programs, self._run, getattr(self._call, "fun", None))

    @property
    def out_tree(self) -> Any:
        return jax.tree_util.tree_structure(self.out_info)

    @property
    def _run(self) -> Callable[..., Any] | None:
        """The compiled stage's call of the flat inputs where it is not the function's own, else None."""
        return getattr(self._call, "run", None)

    def residual_table(self) -> str:
        """The residual table as text (``str(self.residuals)``)."""
        return str(self.residuals)

    def as_text(self, dialect: str | None = None, *, debug_info: bool = False) -> dict[str, str]:
        """Each program's text, as ``jax.jit(...).lower(...).as_text(dialect, debug_info=...)`` prints it. The fused
        step has none here: which variant of it runs, if any, is known once it compiles (``compile().as_text()``).

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> text = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3)).as_text()
            >>> sorted(text), "stablehlo.sine" in text["forward"]
            (['backward', 'forward', 'inference'], True)
        """
        tr = self._training
        avals = {"inference": tr.programs.in_avals, "forward": tr.programs.in_avals,
                 "backward": tr.backward_avals()}
        programs = {"inference": self.inference, "forward": tr.forward_program, "backward": tr.backward_program}
        return {name: jax.jit(as_function(programs[name]), keep_unused=True).lower(*avals[name]).as_text(
            dialect, debug_info=debug_info) for name in PROGRAMS}

    def compile(self, compiler_options: Mapping[str, Any] | None = None) -> "AOTCompiled":
        """Compile the three programs (through the persistent cache); the function then runs these executables.
        A gradient's fused step compiles when its call, or :attr:`AOTCompiled.executables`, first needs it.
        XLA options go in the function's compilers, which its calls use too: ``compiler_options`` is refused."""
        stage_types.check_compile_arguments(compiler_options)
        tr = self._training
        executables = {"inference": tr.programs.inference_exe, "forward": tr.forward_exe, "backward": tr.backward_exe}
        return AOTCompiled(self, executables, _stage_times(tr))

    # Shortcuts to the compiled stage: each compiles on first use.
    @functools.cached_property
    def _compiled(self) -> "AOTCompiled":
        return self.compile()

    @property
    def executables(self) -> Mapping[str, Any]:
        """The compiled executables, ``self.compile().executables`` (compiles them, the fused ``step`` included
        where the call runs it)."""
        return self._compiled.executables

    def memory_analysis(self) -> dict[str, dict[str, int] | None]:
        """``self.compile().memory_analysis()``."""
        return self._compiled.memory_analysis()

    def cost_analysis(self) -> dict[str, dict[str, float] | None]:
        """``self.compile().cost_analysis()``."""
        return self._compiled.cost_analysis()

    @property
    def predicted_peak(self) -> StepPeak | None:
        """The compiled peaks the planner measured for this plan under a byte ``memory_budget``
        (:class:`~jaxaot.partition.StepPeak`: fused and split, with the budget), else None."""
        return self.partition.step_peak

    def _totals(self) -> str:
        t = self.residuals
        offloaded = f", {t.offloaded_bytes} offloaded to host" if t.offloaded_bytes else ""
        peak = self.predicted_peak
        predicted = "" if peak is None or peak.fused is None else f", predicted peak {peak.fused} bytes ({peak})"
        return f"{_count(len(t))}, {_bytes(t)}{offloaded}{predicted}"

    def __str__(self) -> str:
        """A summary of at most 15 lines: the totals, the programs' sizes, the largest residuals, the
        partitioner's notes and the stage times; :meth:`details` prints everything."""
        note = self.partition.gradient_note and f" ({self.partition.gradient_note})"
        sizes = f"forward {_eqns(self.forward)} eqns, backward {_eqns(self.backward)} eqns{note}"
        lines = [f"AOTLowered: {self._totals()}",
                 f"programs: {sizes}; {len(self.recomputed)} forward eqns recomputed in the backward"]
        return "\n".join(lines + _summary_rows(self.residuals) + [_times(self.compile_times)])

    def details(self) -> str:
        """Everything: both programs' jaxprs, every residual with its source line, the recomputed eqns
        and the stage times (what ``jaxaot inspect`` prints)."""
        parts = [f"== forward: {self._totals()} ==", str(self.forward), "== backward ==", str(self.backward),
                 "== residuals ==", str(self.residuals)]
        if self.recomputed:
            parts += ["== recomputed in backward ==", *self.recomputed]
        parts.append(f"== {_times(self.compile_times)} ==")
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"<AOTLowered: {len(self.saved)} residuals, {self.saved_bytes} bytes saved>"

    def _repr_html_(self) -> str | None:
        """Jupyter's view: the split as a graph plus the residual table, drawn by the renderer
        :mod:`jaxaot._src.viz` registers (:func:`jaxaot._src.viz.to_html`; see :mod:`jaxaot._src.display`)."""
        return _display.render(_display.LOWERED, self)


class AOTCompiled:
    """The compiled split of one signature (from ``aot_fn.lower(...).compile()``).

    Called as JAX's ``Compiled`` is, on arrays of the signature it was compiled for, it returns what the
    lowered callable returns: the function's outputs (``aot_fn.lower``), or its value and gradients
    (``jaxaot.value_and_grad(aot_fn).lower``), from these executables. Tracers and arguments of other
    types are a ``TypeError`` that names what differs. As JAX's, a stage of sharded inputs copies uncommitted
    arrays where it was compiled for them; an array committed elsewhere is a
    :class:`~jaxaot.errors.ShardingMismatchError` (a ``ValueError``).

    Attributes:
      lowered: the :class:`AOTLowered` it was compiled from.
      compile_times: seconds per stage, compilations included.
      in_tree / args_info / out_tree: the lowered stage's (:class:`AOTLowered`).
      out_info: the lowered stage's, each output with its sharding on the function's stage.
      input_shardings / input_formats: where, and in which layout, each dynamic input is taken (every program
        of a signature takes them alike), in the pytree of ``in_tree``, as ``jax.jit(f).lower(...).compile()``'s.
      output_shardings: each output's sharding, in the pytree of ``out_tree``, on the function's stage; a
        gradient's stage runs no single executable whose outputs it returns: an ``AttributeError`` says so.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
        >>> compiled = f.lower(jnp.zeros(3)).compile()
        >>> float(compiled(jnp.zeros(3)))
        0.0
    """

    def __init__(self, lowered: AOTLowered, executables: Mapping[str, Any], compile_times: Mapping[str, float]):
        self.lowered = lowered
        self._programs = dict(executables)
        self.compile_times = dict(compile_times)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.lowered._call(args, kwargs)

    @property
    def executables(self) -> dict[str, Any]:
        """The executables by name, ``inference``, ``forward``, ``backward``, and ``step`` where the call runs
        the fused training step (a gradient's stage, ``fused=True``, a real scalar loss, the step not chosen
        split): the executable the call runs (``docs/concepts/fused_step.md``), compiled on first read
        if the call has not compiled it, as :attr:`peak_bytes` compiles it. On an accelerator, where the calls
        weigh the step's variants and time it against the split programs, each read gives the step kept so far.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> vg = jaxaot.value_and_grad(jaxaot.aot_function(lambda x: jnp.sin(x).sum()))
            >>> list(vg.lower(jnp.ones(3)).compile().executables)
            ['inference', 'forward', 'backward', 'step']
        """
        step = self._fused_step() if self.lowered.runs_step else None
        return {**self._programs, STEP: step} if step is not None else dict(self._programs)

    in_tree = property(lambda self: self.lowered.in_tree)
    args_info = property(lambda self: self.lowered.args_info)
    out_tree = property(lambda self: self.lowered.out_tree)

    @property
    def out_info(self) -> Any:
        formats = self.output_formats if self.lowered._run is None else None
        return stage_types.compiled_out_info(self.lowered.out_info, formats)

    @property
    def input_shardings(self) -> Any:
        return stage_types.stage_input_shardings(self.lowered._training.programs, self._programs["inference"])

    @property
    def output_shardings(self) -> Any:
        return stage_types.stage_output_shardings(self.lowered._training.programs, self._programs["inference"],
                                                  self.lowered._run is None)

    input_formats = property(lambda self: stage_types.stage_input_formats(self.lowered._training.programs,
                                                                          self._programs["inference"]))
    output_formats = property(lambda self: stage_types.stage_output_formats(
        self.lowered._training.programs, self._programs["inference"], self.lowered._run is None))

    def _fused_step(self) -> Any:
        """The fused step ``jaxaot.value_and_grad`` runs for this training (compiled here if not yet), or None
        where it runs the split forward and backward."""
        tr = self.lowered._training
        return fused_exe(tr) if _fuses(tr) and fused_choice(tr).runs != "split" else None

    def _runs_step(self) -> tuple[bool, Any]:
        """Whether the call runs the fused step as far as is decided, and that step's executable where it has
        compiled (None where not yet): read without compiling anything."""
        tr = self.lowered._training
        name = fused_name(tr)
        choice = tr.programs.fused_choices.get(name)
        runs = self.lowered.runs_step and _fuses(tr) and (choice is None or choice.runs != "split")
        return runs, tr.programs.executables.get(name) if runs else None

    def _step_label(self) -> str:
        """How the executables' names end: the fused step where the call runs it, said without compiling it."""
        runs, exe = self._runs_step()
        if not runs:
            return ""
        return f", step (the fused training step the call runs{'' if exe is not None else ', compiled on first use'})"

    @functools.cached_property
    def residuals(self) -> ResidualTable:
        """The residual table; on a mesh, with each residual's sharding as the compiled forward gave it."""
        tr = self.lowered._training
        return ResidualTable.of(tr.partition, tr.joint, tr.placement.known_residuals())

    def _head(self) -> list[str]:
        t = self.residuals
        per_device = "" if t.device_nbytes is None or not any(r.sharding for r in t) else (
            f", {t.device_nbytes} bytes per device")
        peaks = [f"{k} {compiled_peak(self._programs[k])} bytes" for k in ("forward", "backward")
                 if k in self._programs]
        _, step = self._runs_step()
        if step is not None:  # compiled already: the summary compiles nothing
            peaks.append(f"step {compiled_peak(step)} bytes")
        elif "peak_bytes" in self.__dict__ and self.peak_bytes is not None:
            peaks.append(f"training step {self.peak_bytes} bytes")
        names = ", ".join(self._programs) + self._step_label()
        return [f"AOTCompiled: {names}; {_count(len(t))}, {_bytes(t)}{per_device}",
                f"compiled peak: {', '.join(peaks)}"]

    def __str__(self) -> str:
        """A summary of at most 15 lines: executables (the fused step where the call runs it), residual bytes,
        compiled peaks, the largest residuals (with their shardings on a mesh); :meth:`details` lists every
        residual."""
        return "\n".join(self._head() + _summary_rows(self.residuals) + [_times(self.compile_times)])

    def details(self) -> str:
        """The summary's totals, every residual with its source line, and the stage times."""
        return "\n".join(self._head() + ["== residuals ==", str(self.residuals), _times(self.compile_times)])

    def memory_analysis(self) -> dict[str, dict[str, int] | None]:
        """Per executable of :attr:`executables` (``step`` included where the call runs the fused step), the
        backend's memory analysis as a dict of byte counts (None where unavailable)."""
        return {k: _safe(lambda e=e: _stats_dict(e.memory_analysis())) for k, e in self.executables.items()}

    def cost_analysis(self) -> dict[str, dict[str, float] | None]:
        """Per executable of :attr:`executables` (``step`` included where the call runs the fused step), the
        backend's cost analysis as a dict (``flops``, ``bytes accessed``, ...)."""
        return {k: _safe(lambda e=e: _cost_dict(e.cost_analysis())) for k, e in self.executables.items()}

    @functools.cached_property
    def peak_bytes(self) -> int | None:
        """The compiled peak device memory, per device, of the step ``jaxaot.value_and_grad`` runs: the fused
        step's (:func:`jaxaot._src.fusion.fused_exe`, compiled here if not yet; ``executables["step"]`` of a
        gradient's stage) where the first output is a real scalar loss and the fused step runs, else the larger
        of the forward's and the backward's. None where the backend reports no memory analysis.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(lambda w, x: jnp.sum(jnp.tanh(x @ w)))
            >>> f.lower(jnp.ones((8, 8)), jnp.ones((4, 8))).compile().peak_bytes > 0
            True
        """
        step = self._fused_step()
        if step is not None:
            return compiled_peak(step)
        peaks = [compiled_peak(self._programs[k]) for k in ("forward", "backward")]
        return None if None in peaks else max(peaks)

    def as_text(self) -> dict[str, str]:
        """Each executable's optimized HLO (``step`` included where the call runs the fused step), as
        ``jax.jit(...).lower(...).compile().as_text()`` prints it (scheduled by XLA: where copies to host memory
        start and end, for one); the StableHLO is ``self.lowered.as_text()``.
        """
        return {k: _safe(lambda e=e: e.as_text()) for k, e in self.executables.items()}

    def __repr__(self) -> str:
        return f"<AOTCompiled: {', '.join(self._programs)}{self._step_label()}>"


def _count(n: int) -> str:
    return f"{n} residual{'' if n == 1 else 's'}"


def _bytes(t: ResidualTable) -> str:
    return f"{t.nbytes} bytes saved ({t.added_bytes} added by the forward, {t.input_bytes} of inputs)"


def _eqns(program: Any) -> int:
    return len(program.jaxpr.eqns)


def _times(times: Mapping[str, float]) -> str:
    return "times: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items())


def _summary_rows(table: ResidualTable) -> list[str]:
    """The largest residuals, a line counting those left out, and the partitioner's notes."""
    rows = table.largest(SUMMARY_ROWS)
    left = len(table) - max(len(rows) - 1, 0)
    more = [f"... {left} more: .details() lists every residual"] if left else []
    return (["largest residuals:"] if rows else []) + rows + more + table.notes()


def _fuses(training: TrainingPrograms) -> bool:
    """Whether ``jaxaot.value_and_grad`` runs this training as one fused step: a real scalar first output,
    and no loop whose stack the runtime sizes between the programs."""
    joint = training.joint
    loss = joint.out_avals[0] if joint.out_avals else None
    return (loss is not None and tuple(loss.shape) == () and jax.numpy.issubdtype(loss.dtype, jax.numpy.floating)
            and not joint.num_aux)


def _stats_dict(stats: Any) -> dict[str, int] | None:
    return None if stats is None else {k: int(getattr(stats, k)) for k in dir(stats)
                                       if k.endswith("_in_bytes") and isinstance(getattr(stats, k), int)}


def _cost_dict(cost: Any) -> dict[str, float] | None:
    if isinstance(cost, (list, tuple)):  # older jax: one dict per device
        cost = cost[0] if cost else None
    return None if cost is None else {str(k): float(v) for k, v in dict(cost).items()}


def _safe(f: Callable[[], Any]) -> Any:
    try:
        return f()
    except Exception:  # backends without analyses raise various errors
        return None
