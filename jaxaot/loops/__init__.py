"""``while_loop`` you can differentiate in reverse mode: primitives, rules, public wrappers.

Modules, bottom up (each imports only those before it):

* :mod:`~jaxaot.loops.common`: the primitives, the ``Loop`` view of their
  parameters, shared helpers;
* :mod:`~jaxaot.loops.overflow`: the overflow check of bounded stacks (an error or NaN, never silent);
* :mod:`~jaxaot.loops.capacity`: how many rows a reverse-mode stack gets, and
  ``dynamic_capacity``;
* :mod:`~jaxaot.loops.lowering`: the impl and lowering (blocked on GPUs);
* :mod:`~jaxaot.loops.revolve`: the binomial checkpointing schedule;
* :mod:`~jaxaot.loops.placement`: a bounded loop's placement and split points, made at trace time;
* :mod:`~jaxaot.loops.offline`: ``max_steps`` with ``checkpoints`` as nested scans (GPUs), and
  which schedule a bounded loop runs;
* :mod:`~jaxaot.loops.api`: ``while_loop`` and ``while_loop_stack_output``;
* :mod:`~jaxaot.loops.segments`: ``max_steps`` stacks in segments on CPUs;
* :mod:`~jaxaot.loops.sweep`: the revolve backward as one loop;
* :mod:`~jaxaot.loops.checkpointed`: the reverse mode of ``checkpoints=k``;
* :mod:`~jaxaot.loops.partial_eval`: how reverse mode splits a loop;
* :mod:`~jaxaot.loops.rules`: every rule, registered in one block;
* :mod:`~jaxaot.loops.rewrite`: ``differentiable``, ``lax.while_loop`` in a traced program replaced by
  jaxaot's loop;
* :mod:`~jaxaot.loops.patch`: ``patch_while_loop``, the same rewrite as a context manager.

Importing this package registers the rules.
"""

from jaxaot.loops import rules  # noqa: F401  (registers the primitives' rules)
from jaxaot.loops.api import while_loop, while_loop_stack_output
from jaxaot.loops.capacity import dynamic_capacity
from jaxaot.loops.overflow import overflow_check_max_steps, reraise_overflow
from jaxaot.loops.patch import patch_while_loop
from jaxaot.loops.rewrite import differentiable

__all__ = [
    "differentiable", "dynamic_capacity", "overflow_check_max_steps", "patch_while_loop", "reraise_overflow",
    "while_loop", "while_loop_stack_output",
]
