"""Typed errors raised by jaxaot.

Each subclasses the builtin a JAX user would expect (``TypeError`` for a wrong
kind of value, ``ValueError`` for a wrong value), so ``except TypeError`` keeps
working, and :class:`JaxaotError` catches all of them.
"""

from __future__ import annotations

from typing import Any


class JaxaotError(Exception):
    """Base class of every error jaxaot raises on purpose."""


class InvalidInputError(JaxaotError, TypeError):
    """A function argument, static argument or option is of the wrong kind."""


class StaticArgumentError(InvalidInputError, ValueError):
    """A static argument cannot key the compile cache: unhashable, or its ``__eq__`` raised or gave no truth value.

    A ``ValueError``, as ``jax.jit`` raises for the same values, and an
    :class:`InvalidInputError` (a ``TypeError``). A ``__hash__`` that raises
    anything but a ``TypeError`` raises its own error, as under ``jax.jit``, with
    a note naming the argument.
    """


class InvalidValueError(JaxaotError, ValueError):
    """An argument or option is of the right kind but has a value jaxaot does not accept.

    An unknown ``group_by`` or ``format``, an empty list of rows to plot, a
    ``--shapes`` spec the ``jaxaot`` command cannot read, a ``jaxaot.config``
    setting of the wrong kind or value (set, or read from its environment variable).
    """


class InvalidOutputError(JaxaotError, TypeError):
    """The user function returned something that is not a pytree of arrays."""


class ResidualsMismatchError(JaxaotError, ValueError):
    """``backward`` got residuals produced for another input signature."""


class CotangentMismatchError(JaxaotError, ValueError):
    """``backward`` got cotangents whose structure, shape or dtype do not match."""


class NoDifferentiationRuleError(JaxaotError, NotImplementedError):
    """A primitive in the function has no differentiation rule."""


class PartitionError(JaxaotError, ValueError):
    """A partitioner produced, or was asked for, an impossible split."""


class MemoryBudgetError(PartitionError):
    """No plan's compiled peak fits a ``memory_budget`` given in bytes.

    The message names the smallest peak the planner reached and what holds it
    there: the largest values live at that peak, by source line.

    Attributes:
      budget: the budget, in bytes.
      smallest_peak: the smallest compiled peak of the step the planner found, in bytes.
      holders: ``(bytes, description)`` of the largest values live at that peak.
    """

    def __init__(self, message: str, budget: int = 0, smallest_peak: int = 0, holders: tuple = ()):
        super().__init__(message)
        self.budget, self.smallest_peak, self.holders = budget, smallest_peak, tuple(holders)


class ShardingMismatchError(JaxaotError, ValueError):
    """Inputs live on different meshes, or an array's sharding is not the one a program was compiled for.

    Also raised where a compiled-autograd forward runs an operation on arrays committed to different devices
    (eager JAX's ``ValueError`` for the same operation).
    """


class LoopFunctionError(JaxaotError, TypeError):
    """A while loop's ``cond_fun`` / ``body_fun`` is not callable or returns the wrong type."""


class LoopCarryMismatchError(JaxaotError, TypeError):
    """``body_fun`` returned a carry whose structure, shape or dtype differs from ``init_val``."""


class InvalidLoopOptionError(JaxaotError, TypeError, ValueError):
    """``max_steps`` or ``checkpoints`` is not a positive integer, or a loop's reverse mode would run its body's
    effects again: an effectful body under a nested plan, or ordered effects and ``io_callback``'s under
    ``checkpoints`` (the backward recomputes steps)."""


class ReverseModeBoundError(JaxaotError, ValueError):
    """A while loop was reverse-differentiated without a bound on its stack."""


class LoopOverflowError(JaxaotError, RuntimeError):
    """A while loop ran more iterations than its ``max_steps`` (raised at run time). ``outputs``: what the call
    returned, NaN where a loop overflowed (as a bare ``jit`` returns them), or None where the error was raised
    elsewhere; a call that donated its arguments has them nowhere else."""

    outputs: Any = None


class XlaCompileError(JaxaotError, RuntimeError):
    """XLA refused to compile one of jaxaot's programs (the message names the program, the platform and XLA's
    error, and suggests workarounds). XLA's own failures show here: ``jax.jit`` of the same computation
    usually fails the same way; ``__cause__`` holds XLA's exception."""


class LoopRewriteError(JaxaotError, NotImplementedError):
    """A ``lax.while_loop`` that :func:`jaxaot.loops.differentiable` (or :func:`jaxaot.loops.patch_while_loop`)
    cannot replace: it sits where the transform cannot reach (the message names the primitive that holds it
    and its source line)."""


class LossOutputError(JaxaotError, ValueError):
    """``aot_export_module(..., trace_joint=True)`` has no usable loss output.

    No ``output_loss_index``, an index out of range, a loss that is not a scalar
    or does not depend on the parameters, or another output that does depend on
    them (the messages are PyTorch's).
    """


# ---------------------------------------------------------------- export and cache
class NotExportableError(JaxaotError, ValueError):
    """``jaxaot.export`` met something it cannot serialize.

    A host callback (``jax.debug.callback``, ``io_callback``, ``pure_callback``),
    a pytree node the manifest cannot describe, or a program ``jax.export``
    refuses; the message names the cause and where it comes from.
    """


class ArtifactError(JaxaotError, ValueError):
    """A saved artifact is missing, unreadable or corrupt (checksum mismatch)."""


class ArtifactVersionError(ArtifactError):
    """A saved artifact comes from an incompatible jaxaot, format or jax version."""


class ArtifactInputError(JaxaotError, TypeError):
    """A loaded artifact got inputs (or residuals) of the wrong structure, shape or dtype."""


class ArtifactVmapError(ArtifactError, NotImplementedError):
    """``jax.vmap`` of a loaded artifact: its ``jax.export`` programs have no batching rule (a
    ``NotImplementedError``, as JAX's own error for it). Export the vmapped function, or use ``jax.lax.map``."""


class ArtifactJvpError(ArtifactError, TypeError):
    """``jax.jvp`` (``jax.jacfwd``, ``jax.hessian``) of a loaded artifact: its programs are differentiated through
    ``jax.custom_vjp``, which has no forward mode (a ``TypeError``, as JAX's own error for it). Use reverse mode,
    or export a function that computes the jvp."""


# ---------------------------------------------------------------- compiled autograd
class HookOutputError(JaxaotError, TypeError):
    """A gradient hook returned a cotangent whose structure, shape or dtype differs from the one it got.

    Raised by :func:`jaxaot.grad_hook` hooks and ``compiled_grad(param_hooks=...)``;
    the message names the hook, the value, what was expected and what came back.
    """


class ScheduleError(JaxaotError, ValueError):
    """A pipeline schedule is invalid: a pass runs before one it needs, or is missing, duplicated or out of range.

    The message names the first offending action and says how to fix it.
    """


class StageMismatchError(JaxaotError, TypeError):
    """A pipeline stage's output does not fit the next stage's input (or the loss).

    Detected before anything runs, with ``jax.eval_shape``; the message names
    both stages, the shape and dtype one returns, and JAX's reason the other
    does not take it (which names the shape it wanted).
    """


class PipelineMemoryError(JaxaotError, RuntimeError):
    """A compiled pipeline step needs more memory than a device has, found before the step first runs.

    Raised instead of running into an out-of-memory error on one device while the others wait for it in
    a collective. The message names the step's compiled per-device peak, the device's limit, what the
    device holds already, and what to change (schedule, microbatches, the stages' ``memory_budget``).

    Attributes:
      peak: the step's compiled peak, in bytes per device (arguments included).
      limit: the device's memory limit, in bytes (``Device.memory_stats()["bytes_limit"]``).
      available: what the step may use there: the limit less what the device holds besides the step's arguments.
      device: the device that does not fit it.
    """

    def __init__(self, message: str, peak: int = 0, limit: int = 0, available: int = 0, device: object = None):
        super().__init__(message)
        self.peak, self.limit, self.available, self.device = peak, limit, available, device

    def __reduce__(self):
        # A jax.Device does not pickle: it travels as its platform and id, and is found again where it exists.
        where = (self.device.platform, self.device.id) if hasattr(self.device, "platform") else self.device
        return _pipeline_memory_error, (type(self), str(self), self.peak, self.limit, self.available, where)


def _pipeline_memory_error(cls, message, peak, limit, available, where):
    if isinstance(where, tuple):
        import jax

        try:
            found = [d for d in jax.devices(where[0]) if d.id == where[1]]
        except RuntimeError:  # no such backend in this process
            found = []
        where = found[0] if found else f"{where[0]}:{where[1]}"
    return cls(message, peak, limit, available, where)


class CacheWarning(UserWarning):
    """A persistent-cache entry was corrupt or could not be read or written.

    The cache never fails a call: the entry is rebuilt (or caching is skipped)
    and the warning is issued once per file.
    """


__all__ = [
    "JaxaotError", "InvalidInputError", "StaticArgumentError", "InvalidValueError", "InvalidOutputError",
    "ResidualsMismatchError", "CotangentMismatchError", "NoDifferentiationRuleError", "PartitionError",
    "MemoryBudgetError", "ShardingMismatchError", "LoopFunctionError", "LoopCarryMismatchError",
    "InvalidLoopOptionError", "ReverseModeBoundError", "LoopOverflowError", "XlaCompileError",
    "LoopRewriteError", "LossOutputError", "NotExportableError", "ArtifactError", "ArtifactVersionError",
    "ArtifactInputError", "ArtifactVmapError", "ArtifactJvpError", "HookOutputError", "ScheduleError",
    "StageMismatchError", "PipelineMemoryError",
    "CacheWarning",
]
